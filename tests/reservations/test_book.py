"""Booking through the API on a real ledger: placement, pending, quotas, lifecycle."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection

from audit.models import AuditEvent
from compute.platform.events.models import Event
from fleet.models import Device, Node, NodeSpec
from reservations.models import Booking, Quota, Reservation
from tests.factories import make_node, make_unreachable
from tests.reservations.conftest import HOUR, gpus, reserve
from tests.support.work import queued, run_due_work
from tests.support.writes import assert_wrote


def booked_uuids(rsv_id):
    return sorted(Booking.objects.filter(allocation__reservation_id=rsv_id,
                                         allocation__ended_at__isnull=True)
                  .values_list("device__uuid", flat=True))


def test_four_gpus_take_a_whole_nvlink_domain(root, pool):
    node = make_node(pool["id"])
    rsv = reserve(root, pool, 4).result
    assert rsv["state"] == "binding"
    assert rsv["nodeId"] == node.id
    domains = set(Device.objects.filter(uuid__in=booked_uuids(rsv["id"]))
                  .values_list("nvlink_domain", flat=True))
    assert len(domains) == 1
    assert rsv["hostShare"] == {"vcpus": 48, "memoryGiB": 384}
    node.refresh_from_db()
    assert (node.vcpus_allocated, node.memory_gib_allocated) == (48, 384)


def test_create_writes_one_audit_and_one_placed_event(root, pool):
    make_node(pool["id"])
    with assert_wrote(audit="reservation.create", events=["reservation.placed"]):
        rsv = reserve(root, pool, 2, startIn=60_000).result
    assert AuditEvent.objects.filter(target=rsv["id"], action="reservation.create").count() == 1
    assert list(Event.objects.filter(subject=rsv["id"]).values_list("type", flat=True)) == [
        "reservation.placed"]


def test_a_reservation_that_starts_now_is_bound_by_its_create_call(root, pool):
    """No worker's turn between the call and the node's spec: the hold is in the node's
    next generation when the call answers, under the create's one audit row."""
    node = make_node(pool["id"])
    with assert_wrote(audit="reservation.create",
                      events=["reservation.placed", "reservation.binding"]):
        rsv = reserve(root, pool, 2).result
    assert rsv["state"] == "binding"
    spec = NodeSpec.objects.filter(node=node).latest("generation")
    assert (spec.generation, [a["reservationId"] for a in spec.spec["allocations"]]) == \
        (2, [rsv["id"]])
    row = AuditEvent.objects.get(target=rsv["id"], action="reservation.create")
    assert row.data["binding"] == {"nodeId": node.id, "allocationId": rsv["allocationId"]}
    assert not queued("reservation", rsv["id"])  # no worker's turn to wait for
    later = reserve(root, pool, 2, startIn=60_000).result
    assert (later["state"], queued("reservation", later["id"])) == ("placed", True)


def test_nvlink_all_never_spans_domains(root, pool):
    make_node(pool["id"])
    assert reserve(root, pool, 2).result["state"] == "binding"  # leaves nv0 with 2 free
    assert reserve(root, pool, 2).result["state"] == "binding"  # fills nv0
    # 4 GPUs left in nv1: nvlink-all of 4 fits; of 5 never (5 > any domain): refused.
    never = reserve(root, pool, 5, "nvlink-all")
    assert (never.status, never.code) == (409, "never_fits"), never.body
    assert reserve(root, pool, 4, "nvlink-all").result["state"] == "binding"


def test_selector_and_product_filters(root, pool):
    small = make_node(pool["id"], product="H100-PCIE-40GB", vram=40)
    big = make_node(pool["id"])
    assert reserve(root, pool, 1, selector="vramGiB >= 80").result["nodeId"] == big.id
    assert reserve(root, pool, 1, product="H100-PCIE-40GB").result["nodeId"] == small.id
    answer = reserve(root, pool, 1, model="A100")
    assert (answer.code, answer.body["error"]["details"]["field"]) == ("invalid_argument",
                                                                      "model")
    answer = reserve(root, pool, 1, selector="vram > 1")
    assert answer.code == "invalid_argument"


def test_cordoned_unreachable_unhealthy_and_adopting_nodes_are_skipped(root, pool):
    cordoned = make_node(pool["id"])
    root("nodes.cordon", nodeId=cordoned.id, reason="maintenance")
    unreachable = make_node(pool["id"])
    make_unreachable(unreachable)
    unhealthy = make_node(pool["id"])
    Node.objects.filter(pk=unhealthy.pk).update(health="unhealthy")
    make_node(pool["id"], adopted=False)
    assert reserve(root, pool, 1).result["state"] == "pending"
    good = make_node(pool["id"])
    assert reserve(root, pool, 1).result["nodeId"] == good.id


def test_pending_is_placed_after_a_release(root, pool):
    make_node(pool["id"])
    first = reserve(root, pool, 8).result
    waiting = reserve(root, pool, 4).result
    assert waiting["state"] == "pending"
    assert waiting["nodeId"] is None
    with assert_wrote(audit="reservation.release", events=["reservation.released"]):
        root("reservations.release", reservationId=first["id"])
    assert root("reservations.get", reservationId=waiting["id"])["state"] == "pending"
    assert queued("pool", pool["id"])  # in the release's own transaction
    with assert_wrote(audit="reservation.place", events=["reservation.placed"]):
        run_due_work()
    again = root("reservations.get", reservationId=waiting["id"])
    assert again["state"] == "placed"
    assert len(booked_uuids(waiting["id"])) == 4
    types = list(Event.objects.filter(subject=waiting["id"]).values_list("type", flat=True))
    assert types == ["reservation.pending", "reservation.placed"]


def test_pending_retries_in_creation_order(root, pool):
    make_node(pool["id"])
    holder = reserve(root, pool, 8).result
    older = reserve(root, pool, 6).result
    younger = reserve(root, pool, 6).result
    root("reservations.release", reservationId=holder["id"])
    run_due_work()
    states = {r["id"]: r["state"] for r in root("reservations.list")["items"]}
    assert (states[older["id"]], states[younger["id"]]) == ("placed", "pending")


@pytest.mark.django_db(transaction=True)  # now() must move between create and release
def test_release_ends_bookings_at_database_now_and_refunds(root, pool, acme):
    node = make_node(pool["id"])
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 4})
    rsv = reserve(acme, pool, 4).result
    assert Quota.objects.get(tenant__slug="acme").used == 4
    with assert_wrote(audit="reservation.release", events=["reservation.released"]):
        released = acme("reservations.release", reservationId=rsv["id"])
    assert released["state"] == "released"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), bool_and(upper(during) <= now()), "
                       "bool_and(upper(during) > lower(during)) FROM reservations_booking")
        assert cursor.fetchone() == (4, True, True)
    assert Quota.objects.get(tenant__slug="acme").used == 0
    node.refresh_from_db()
    assert node.vcpus_allocated == 0
    usage = acme("usage.list")["items"]
    assert [u["meter"] for u in usage] == ["gpu.H100.hours"]
    with assert_wrote(audit=None):
        again = acme.call("reservations.release", reservationId=rsv["id"])
    assert (again.status, again.code) == (409, "invalid_state")


def test_quota_exceeded_names_the_numbers_and_writes_nothing(root, pool, acme):
    make_node(pool["id"])
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 4})
    assert reserve(acme, pool, 3).ok
    with assert_wrote(audit=None):
        answer = reserve(acme, pool, 2)
    assert (answer.status, answer.code) == (409, "quota_exceeded")
    assert answer.body["error"]["details"] == {"resource": "gpu", "limit": 4, "used": 3,
                                               "requested": 2}
    assert Reservation.objects.count() == 1


def test_owner_quota_is_unlimited(root, pool):
    for _ in range(3):
        make_node(pool["id"])
    assert all(reserve(root, pool, 8).result["state"] == "binding" for _ in range(3))


def test_cancel_withdraws_a_future_reservation_and_refuses_a_started_one(root, pool):
    make_node(pool["id"])  # the two windows never meet: one node's host share holds both
    later = reserve(root, pool, 8, startIn=2 * HOUR).result
    assert later["state"] == "placed"
    now = reserve(root, pool, 8).result  # fits before the later one starts
    assert now["state"] == "binding"
    with assert_wrote(audit="reservation.cancel", events=["reservation.cancelled"]):
        cancelled = root("reservations.release", reservationId=later["id"], cancel=True)
    assert cancelled["state"] == "cancelled"
    assert booked_uuids(later["id"]) == []
    answer = root.call("reservations.release", reservationId=now["id"], cancel=True)
    assert answer.code == "invalid_state"


def test_extend_grows_the_window_or_names_the_blocking_one(root, pool):
    make_node(pool["id"], gpus=1, domains=(1,))
    first = reserve(root, pool, 1).result
    second = reserve(root, pool, 1, startIn=2 * HOUR).result
    assert second["state"] == "placed"
    grown = root("reservations.extend", reservationId=first["id"], by=HOUR // 2)
    assert grown["durationMs"] == HOUR + HOUR // 2
    answer = root.call("reservations.extend", reservationId=first["id"], by=HOUR)
    assert (answer.status, answer.code) == (409, "capacity_conflict")
    assert answer.body["error"]["details"]["blockedFrom"] == second["start"]
    assert "booked from" in answer.body["error"]["message"]
    unchanged = root("reservations.get", reservationId=first["id"])
    assert unchanged["end"] == grown["end"]


def test_extend_shrink_frees_capacity_for_pending(root, pool):
    make_node(pool["id"], gpus=1, domains=(1,))
    first = reserve(root, pool, 1, duration=3 * HOUR).result
    waiting = reserve(root, pool, 1, startIn=2 * HOUR).result
    assert waiting["state"] == "pending"
    with assert_wrote(audit="reservation.extend", events=["reservation.extended"]):
        root("reservations.extend", reservationId=first["id"], by=-2 * HOUR)
    run_due_work()
    assert root("reservations.get", reservationId=waiting["id"])["state"] == "placed"


def test_a_tenant_cannot_release_another_tenants_reservation(root, pool, acme):
    make_node(pool["id"])
    rsv = reserve(root, pool, 1).result
    answer = acme.call("reservations.release", reservationId=rsv["id"])
    assert answer.status == 404
    assert root("reservations.get", reservationId=rsv["id"])["state"] == "binding"


def test_expired_windows_are_released(root, pool):
    from compute.platform.queue.models import WorkItem
    from reservations.reconcilers import reconcile_reservation, sweep

    make_node(pool["id"])
    rsv = reserve(root, pool, 2).result
    with connection.cursor() as cursor:
        cursor.execute("UPDATE reservations_reservation SET during = tstzrange(now() - "
                       "interval '2 hours', now() - interval '1 hour') WHERE id = %s",
                       [rsv["id"]])
        cursor.execute("UPDATE reservations_booking SET during = tstzrange(now() - "
                       "interval '2 hours', now() - interval '1 hour')")
    sweep()  # the timer: the ended window becomes a work item …
    assert WorkItem.objects.filter(kind="reservation", key=rsv["id"]).exists()
    with assert_wrote(audit="reservation.expire", events=["reservation.released"]):
        reconcile_reservation(rsv["id"])  # … whose handler releases it
    assert root("reservations.get", reservationId=rsv["id"])["state"] == "released"
    usage = root("usage.list")["items"]  # one record per hour the window touched
    assert sum(Decimal(u["quantity"]) for u in usage) == Decimal("2.000000")
    assert all(":00:00" in u["windowEnd"] for u in sorted(
        usage, key=lambda u: u["windowStart"])[:-1])


@pytest.mark.django_db(transaction=True)  # now() must move between create and release
def test_usage_lists_one_subjects_records(root, pool):
    make_node(pool["id"])
    first, second = reserve(root, pool, 2).result, reserve(root, pool, 2).result
    for rsv in (first, second):
        root("reservations.release", reservationId=rsv["id"])
    assert {u["subject"] for u in root("usage.list")["items"]} == {first["id"], second["id"]}
    only = root("usage.list", subject=second["id"])["items"]
    assert [u["subject"] for u in only] == [second["id"]]
    assert root("usage.list", subject="rsv_unknown")["items"] == []


@pytest.mark.parametrize("body", [
    {"devices": gpus(0)},
    {"devices": [{"class": "cpu", "count": 1}]},
    {"devices": gpus(1, "ring")},
    {"devices": gpus(1) * 2},
    {"devices": gpus(1), "duration": 10},
    {"devices": gpus(1), "binding": "exclusive"},
    {"devices": gpus(1), "startIn": 10, "start": "2030-01-01T00:00:00Z"},
])
def test_bad_reservation_requests_are_400(root, pool, body):
    answer = root.call("reservations.create", {"poolId": pool["id"], "duration": HOUR, **body})
    assert (answer.status, answer.code) == (400, "invalid_argument"), answer.body


def test_same_key_returns_the_same_reservation(root, pool):
    make_node(pool["id"])
    first = reserve(root, pool, 2, idempotencyKey="job-7").result
    second = reserve(root, pool, 2, idempotencyKey="job-7").result
    assert first["id"] == second["id"]
    assert Reservation.objects.count() == 1
    assert reserve(root, pool, 3, idempotencyKey="job-7").code == "idempotency_key_reused"


def test_start_in_the_past_is_refused(root, pool):
    answer = reserve(root, pool, 1, start="2001-01-01T00:00:00Z")
    assert answer.body["error"]["details"]["field"] == "start"


def test_future_start_books_the_later_window(root, pool):
    make_node(pool["id"])
    rsv = reserve(root, pool, 1, startIn=2 * HOUR).result
    booking = Booking.objects.get(allocation__reservation_id=rsv["id"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    assert booking.during.lower - now > timedelta(hours=1, minutes=59)
