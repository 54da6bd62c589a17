"""The gateway's cursor over NodeSpecs never passes a spec that commits late."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from bcd.contract.crypto import BadSignature
from bcd.contract.signed import open_spec
from fleet.models import Node
from fleet.pki import pki
from fleet.selectors import latest_spec, specs_since
from fleet.services.specs import node_spec_change_locked
from tests.factories import make_node

pytestmark = pytest.mark.django_db(transaction=True)


class Writer(threading.Thread):
    """Writes one spec of `node_id` in its own transaction, step by step on command."""

    def __init__(self, node_id: str, *, take_txid_first: bool = False) -> None:
        super().__init__(daemon=True)
        self.node_id = node_id
        self.take_txid_first = take_txid_first
        self.go = {step: threading.Event() for step in ("begin", "write", "commit")}
        self.done = {step: threading.Event() for step in ("begin", "write", "commit")}

    def step(self, name: str) -> None:
        self.go[name].set()
        assert self.done[name].wait(10), f"{self.node_id}: {name} did not finish"

    def run(self) -> None:
        try:
            self.go["begin"].wait(10)
            with transaction.atomic():
                if self.take_txid_first:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT pg_current_xact_id()")
                self.done["begin"].set()
                self.go["write"].wait(10)
                node = Node.objects.select_for_update().get(pk=self.node_id)
                node_spec_change_locked(node, add={"allocationId": "alc_x", "gpus": []})
                self.done["write"].set()
                self.go["commit"].wait(10)
            self.done["commit"].set()
        finally:
            connection.close()


@pytest.mark.parametrize("late_has_older_txid", [False, True])
def test_a_spec_committing_after_a_later_one_is_still_pushed(pool, late_has_older_txid):
    """`late` writes first (lower row id) and commits last. Its transaction id is the
    younger one, or (with a transaction that took its id first) the older one."""
    one, two = make_node(pool["id"]), make_node(pool["id"])
    _, cursor = specs_since(after=None)
    late = Writer(one.id, take_txid_first=not late_has_older_txid)
    early = Writer(two.id, take_txid_first=late_has_older_txid)
    late.start()
    early.start()
    first, second = (late, early) if late_has_older_txid else (early, late)
    first.step("begin")
    second.step("begin")
    late.step("write")
    early.step("write")
    early.step("commit")
    pushed: list[str] = []
    specs, cursor = specs_since(after=cursor)
    pushed += [spec["nodeId"] for spec in specs]
    late.step("commit")
    specs, cursor = specs_since(after=cursor)
    pushed += [spec["nodeId"] for spec in specs]
    late.join(10)
    early.join(10)
    assert sorted(pushed) == sorted([one.id, two.id])  # each pushed once, none skipped
    assert specs_since(after=cursor) == ([], cursor)


def test_what_the_gateway_relays_is_the_spec_signed_for_its_node_and_generation(pool):
    node = make_node(pool["id"])
    _, cursor = specs_since(after=None)
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.id)
        row = node_spec_change_locked(locked, add={"allocationId": "alc_x", "gpus": []})
    specs, _ = specs_since(after=cursor)
    relayed = next(s for s in specs if s["generation"] == row.generation)
    pin = pki().pins()["joinSigningKeyPin"]
    assert open_spec(relayed["json"], pin=pin, node_id=node.id,
                     generation=row.generation) == row.spec
    assert latest_spec(node_id=node.id)["json"] == relayed["json"]
    with pytest.raises(BadSignature):  # the same spec is no good for another node
        open_spec(relayed["json"], pin=pin, node_id="node_other", generation=row.generation)
