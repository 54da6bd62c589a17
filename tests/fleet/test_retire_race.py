"""Retiring a node races a booking for it, on real Postgres, over and over: whichever
commits first wins, and a retired node never holds a live allocation."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.test import Client

from fleet.models import Node
from reservations.models import Allocation
from tests.factories import make_node
from tests.reservations.conftest import HOUR, gpus
from tests.support.client import ApiClient

pytestmark = pytest.mark.django_db(transaction=True)
ROUNDS = 12


def call(start: threading.Barrier, answers: dict[str, object], token: str, name: str,
         method: str, **body: object) -> None:
    """One racer: its own connection, released once the call is answered."""
    api = ApiClient(Client()).as_token(token)
    start.wait()
    try:
        answers[name] = api.call(method, **body)
    finally:
        connections.close_all()


def test_a_booking_and_a_retire_racing_never_leave_a_retired_node_holding(pool, root_token):
    outcomes = {"retired": 0, "booked": 0}
    for _ in range(ROUNDS):
        node = make_node(pool["id"], gpus=8, domains=(8,))  # the pool's only free machine
        answers: dict[str, object] = {}
        start = threading.Barrier(2)

        racers = [threading.Thread(target=call, args=(
                      start, answers, root_token, "book", "reservations.create"),
                      kwargs={"poolId": pool["id"], "devices": gpus(8), "duration": HOUR}),
                  threading.Thread(target=call, args=(
                      start, answers, root_token, "retire", "nodes.retire"),
                      kwargs={"nodeId": node.id, "reason": "race"})]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(60)
        retired = Node.objects.get(pk=node.pk).provision_state == "retired"
        live = Allocation.objects.filter(node=node, ended_at__isnull=True)
        assert not (retired and live.exists()), "a retired node holds a live allocation"
        booked = answers["book"]
        if retired:
            outcomes["retired"] += 1
            assert answers["retire"].code is None  # type: ignore[attr-defined]
        else:
            outcomes["booked"] += 1
            assert answers["retire"].code == "invalid_state"  # type: ignore[attr-defined]
            assert live.exists()
        rsv = booked.result["id"] if booked.code is None else None  # type: ignore[attr-defined]
        admin = ApiClient(Client()).as_token(root_token)
        if rsv:
            admin("reservations.release", reservationId=rsv)
        if not retired:  # the next round's node is the only free one
            admin("nodes.retire", nodeId=node.id, reason="next round")
    assert sum(outcomes.values()) == ROUNDS
