"""A node's host share is held over time: GPU bookings that never meet do not add up, ones
that meet do, and a sandbox (open-ended) fits only under the most they hold at once."""

from __future__ import annotations

from functools import partial

import psycopg
import pytest
from django.db import IntegrityError

from compute.core.db import conninfo
from compute.http.edge import error_answer
from fleet.models import Node
from reservations.hostshare import expected_counters
from reservations.models import Allocation, Sandbox
from tests.factories import make_node
from tests.reservations.conftest import HOUR, reserve
from tests.support.ledger import run_together

DAY = 24 * HOUR


def counters(node) -> tuple[int, int]:
    node = Node.objects.get(pk=node.pk)
    return node.vcpus_allocated, node.memory_gib_allocated


def test_back_to_back_whole_node_bookings_all_fit_on_one_node(root, pool):
    node = make_node(pool["id"])  # 96 vCPUs, 1024 GiB; 12 and 96 per GPU
    days = [reserve(root, pool, 8, startIn=k * DAY + HOUR).result for k in range(1, 4)]
    assert [r["state"] for r in days] == ["placed"] * 3, [r["failureReason"] for r in days]
    assert {r["nodeId"] for r in days} == {node.id}
    assert counters(node) == (96, 768) == expected_counters(node.id)
    root("reservations.release", reservationId=days[1]["id"], cancel=True)
    assert counters(node) == (96, 768) == expected_counters(node.id)


def test_bookings_that_meet_add_up(root, pool):
    node = make_node(pool["id"])
    first = reserve(root, pool, 4, startIn=DAY, duration=4 * HOUR).result
    meets = reserve(root, pool, 4, startIn=DAY + 2 * HOUR, duration=4 * HOUR).result
    assert first["nodeId"] == meets["nodeId"] == node.id
    assert counters(node) == (96, 768)
    root("reservations.release", reservationId=meets["id"], cancel=True)
    assert counters(node) == (48, 384) == expected_counters(node.id)


def test_a_sandbox_fits_only_under_the_peak_of_future_bookings(root, pool):
    node = make_node(pool["id"])
    reserve(root, pool, 4, startIn=DAY)
    reserve(root, pool, 4, startIn=2 * DAY)  # never meets the first: the peak stays 48
    assert counters(node) == (48, 384)
    assert root.call("sandboxes.create", poolId=pool["id"], vcpus=48, memoryGiB=64).ok
    refused = root.call("sandboxes.create", poolId=pool["id"], vcpus=1, memoryGiB=1)
    assert refused.code == "capacity_conflict"
    # Now a third booking meeting the second would need 48 more vCPUs than are left.
    pending = reserve(root, pool, 4, startIn=2 * DAY).result
    assert pending["state"] == "pending", pending
    assert counters(node) == (96, 448) == expected_counters(node.id)


def test_an_extension_into_held_host_share_is_refused_naming_it(root, pool):
    node = make_node(pool["id"])
    early = reserve(root, pool, 4, startIn=DAY, duration=2 * HOUR).result
    # On the other NVLink domain, so only the host share (not a GPU) stands in the way.
    reserve(root, pool, 4, startIn=DAY + 3 * HOUR, duration=2 * HOUR, selector="index >= 4")
    root("sandboxes.create", poolId=pool["id"], vcpus=48, memoryGiB=64)
    refused = root.call("reservations.extend", reservationId=early["id"], by=2 * HOUR)
    assert refused.code == "capacity_conflict", refused.body
    assert "vCPUs are held by other bookings or sandboxes" in refused.body["error"]["message"]
    assert counters(node) == (96, 448) == expected_counters(node.id)
    assert root.call("reservations.extend", reservationId=early["id"], by=HOUR).ok


@pytest.mark.django_db(transaction=True)
def test_racing_bookers_and_sandboxes_keep_the_counters_equal_to_a_recount(root, pool):
    """Four bookers take and give back 4 GPUs over overlapping hours of one node while a
    fifth thread runs sandboxes. Each booking recounts the node's peak after locking it, so
    the stored counters must equal a recount at the end: a recount from a stale snapshot
    would leave them below the real peak."""
    import random

    from django.db import connections

    from compute.core.errors import CapacityConflict
    from compute.platform.tenancy.models import Principal, Tenant
    from reservations.services.book import reservation_create
    from reservations.services.release import reservation_release
    from reservations.services.sandboxes import sandbox_create, sandbox_release
    from reservations.shape import Shape

    node = make_node(pool["id"])
    tenant = Tenant.objects.get(slug="root")
    actor = Principal.objects.get(pk=root("system.whoami")["principalId"])
    problems: list[str] = []
    placed = [0]

    def booker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(12):
                rsv = reservation_create(tenant=tenant, actor=actor, pool_id=pool["id"],
                                         shape=Shape(count=4), duration_ms=2 * HOUR,
                                         start_in_ms=DAY + rng.randrange(4) * HOUR)
                if rsv.state == "placed":
                    placed[0] += 1
                if rng.random() < 0.5:
                    reservation_release(tenant=tenant, actor=actor, reservation_id=rsv.id)
        except Exception as error:
            problems.append(repr(error))
        finally:
            connections.close_all()

    def sandboxes() -> None:
        try:
            for _ in range(12):
                try:
                    box = sandbox_create(tenant=tenant, actor=actor, pool_id=pool["id"],
                                         vcpus=24, memory_gib=8)
                except CapacityConflict:
                    continue
                sandbox_release(tenant=tenant, actor=actor, sandbox_id=box.id)
        except Exception as error:
            problems.append(repr(error))
        finally:
            connections.close_all()

    run_together(*(partial(booker, n) for n in range(4)), sandboxes)
    assert problems == []
    assert placed[0] > 0
    assert counters(node) == expected_counters(node.id)


def raw_connection():
    from django.db import connection

    return psycopg.connect(conninfo(connection.settings_dict))


@pytest.mark.django_db(transaction=True)
def test_two_claims_that_fit_alone_and_not_together_are_refused_at_the_second_commit(root,
                                                                                    pool):
    """Two transactions each raise a claim on one node without counting it (SQL by hand,
    standing for any path that forgets the counters), driven step by step: each fits
    alone, both do not. The node's referee at commit takes the first and refuses the
    second, so the node never holds more than its size."""
    node = make_node(pool["id"])  # 96 vCPUs; 12 per GPU
    first, second = (reserve(root, pool, 1, startIn=DAY).result for _ in range(2))
    allocations = [Allocation.objects.get(reservation_id=r["id"]).id for r in (first, second)]
    one, two = raw_connection(), raw_connection()
    try:
        for conn, allocation in ((one, allocations[0]), (two, allocations[1])):
            conn.execute("UPDATE reservations_allocation SET vcpus = 60 WHERE id = %s",
                         [allocation])  # 60 + 12 fit in 96; 60 + 60 do not
        one.commit()
        with pytest.raises(psycopg.errors.CheckViolation, match="fleet_node_vcpus_within_size"):
            two.commit()
    finally:
        one.close()
        two.close()
    assert expected_counters(node.id) == counters(node) == (72, 192)
    assert Allocation.objects.get(pk=allocations[1]).vcpus == 12  # the refused one undone


@pytest.mark.django_db(transaction=True)
def test_a_claim_written_without_the_counters_is_counted_at_commit(root, pool):
    """A claim raised by a writer that never touched the counters is counted at commit
    (a tampered sandbox), and refused there once it no longer fits."""
    node = make_node(pool["id"])
    reserve(root, pool, 2, startIn=DAY)  # 24 vCPUs, 192 GiB over its window
    box = root("sandboxes.create", poolId=pool["id"], vcpus=8, memoryGiB=16)
    assert counters(node) == (32, 208)
    Sandbox.objects.filter(pk=box["id"]).update(vcpus=40)  # its own transaction
    assert counters(node) == (64, 208) == expected_counters(node.id)
    with pytest.raises(IntegrityError, match="fleet_node_vcpus_within_size") as refused:
        Sandbox.objects.filter(pk=box["id"]).update(vcpus=80)  # 80 + 24 > 96
    status, body = error_answer(refused.value, "req_1")  # a refusal at commit, as answered
    assert (status, body["error"]["code"]) == (409, "capacity_conflict")
