"""Maintenance windows: a node takes no bookings for a window; one that overlaps bookings is
refused naming them, or with `move` their not-yet-started bookings go elsewhere first (all
or none); capacity and the board show the GPUs in maintenance; sandboxes stay off."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from tests.factories import make_node
from tests.support.ledger import overlapping_bookings
from tests.support.writes import assert_wrote

HOUR, DAY = 3_600_000, 86_400_000


def book(root, pool, gpus: int, *, start_in: int | None = None, **extra):
    body = {"poolId": pool["id"], "duration": 4 * HOUR,
            "devices": [{"class": "gpu", "count": gpus}], **extra}
    if start_in is not None:
        body["startIn"] = start_in
    return root.call("reservations.create", body)


def window(root, node_id, *, start_in=DAY, hours=8, move=False):
    return root.call("maintenance.create", nodeId=node_id, startIn=start_in,
                     duration=hours * HOUR, reason="PSU swap", move=move)


overlaps = overlapping_bookings


def test_a_window_over_bookings_is_refused_naming_them_and_writes_nothing(root, pool):
    node = make_node(pool["id"])
    later = book(root, pool, 8, start_in=DAY + HOUR).result
    with assert_wrote(audit=None, events=[]):
        refused = window(root, node.id)
    assert (refused.status, refused.code) == (409, "capacity_conflict")
    assert later["id"] in refused.body["error"]["message"]
    assert "--move" in refused.body["error"]["message"]
    assert refused.body["error"]["details"]["reservations"] == [later["id"]]
    assert root("maintenance.list", nodeId=node.id)["items"] == []


def test_move_places_future_bookings_elsewhere_first(root, pool):
    node = make_node(pool["id"])
    later = book(root, pool, 4, start_in=DAY + HOUR).result
    assert later["nodeId"] == node.id
    spare = make_node(pool["id"])
    with assert_wrote(audit="node.maintenance",
                      events=["reservation.replaced", "reservation.placed",
                              "node.maintenance.scheduled"]):
        made = window(root, node.id, move=True)
    assert made.ok, made.body
    assert made.result["moved"] == {later["id"]: spare.id}
    moved = root("reservations.get", reservationId=later["id"])
    assert (moved["state"], moved["nodeId"], moved["start"]) == (
        "placed", spare.id, later["start"])  # same window, another node
    # Nothing lands in the window: 8 GPUs then fit neither the node nor the half-used spare.
    inside = book(root, pool, 8, start_in=DAY + 2 * HOUR).result
    assert inside["state"] == "pending"
    after = book(root, pool, 8, start_in=DAY + 9 * HOUR).result  # after the window: fine
    assert (after["state"], after["nodeId"]) == ("placed", node.id)
    assert overlaps() == 0
    [listed] = root("maintenance.list", nodeId=node.id)["items"]
    assert listed == made.result["window"]


def test_what_holds_the_node_now_is_never_moved(root, pool):
    node = make_node(pool["id"])
    now = book(root, pool, 2).result
    refused = window(root, node.id, start_in=0, move=True)
    assert (refused.status, refused.code) == (409, "capacity_conflict")
    assert now["id"] in refused.body["error"]["message"]
    assert "never moved" in refused.body["error"]["message"]


def test_capacity_and_the_board_show_gpus_in_maintenance(root, pool):
    from compute.platform.tenancy.models import Tenant
    from reservations.board import fleet_board

    node, other = make_node(pool["id"]), make_node(pool["id"])
    held = window(root, node.id, start_in=0).result["window"]
    capacity = root("capacity.get", poolId=pool["id"])
    assert capacity["gpusNotSchedulable"]["maintenance"] == 8
    assert (capacity["gpu"]["allocatable"], capacity["gpu"]["available"]) == (8, 8)
    placed = book(root, pool, 8).result
    assert placed["nodeId"] == other.id  # never the node in maintenance
    tiles = {t.node_id: t for t in fleet_board(tenant=Tenant.objects.get(slug="root")).tiles}
    assert {g.maintenance_id for g in tiles[node.id].gpus} == {held["id"]}
    assert {(g.maintenance_id, bool(g.reservation_id)) for g in tiles[other.id].gpus} == {
        ("", True)}


def test_a_window_now_keeps_sandboxes_off_and_refuses_a_node_running_one(root, cpu_pool):
    busy, idle = (make_node(cpu_pool["id"], gpus=0, domains=()) for _ in range(2))
    box = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=2, memoryGiB=4)
    on, off = (busy, idle) if box["nodeId"] == busy.id else (idle, busy)
    refused = window(root, on.id, start_in=0)
    assert (refused.status, refused.code) == (409, "capacity_conflict")
    assert box["id"] in refused.body["error"]["message"]
    assert window(root, off.id, start_in=0).ok
    for _ in range(3):  # every new sandbox lands on the node that is not in maintenance
        assert root("sandboxes.create", poolId=cpu_pool["id"], vcpus=1,
                    memoryGiB=1)["nodeId"] == on.id


def test_cancelling_a_window_gives_the_gpus_back(root, pool):
    node = make_node(pool["id"])
    held = window(root, node.id, start_in=0).result["window"]
    waiting = book(root, pool, 8).result
    assert waiting["state"] == "pending"
    with assert_wrote(audit="node.maintenance.cancel", events=["node.maintenance.cancelled"]):
        cancelled = root("maintenance.cancel", windowId=held["id"], reason="done early")
    assert cancelled["cancelledAt"] is not None
    from reservations.reconcilers import reconcile_pool  # what the worker runs next

    reconcile_pool(pool["id"])
    assert root("reservations.get", reservationId=waiting["id"])["nodeId"] == node.id
    again = root.call("maintenance.cancel", windowId=held["id"])
    assert (again.status, again.code) == (409, "invalid_state")


def test_move_is_all_or_none(root, pool):
    node, _spare = make_node(pool["id"]), make_node(pool["id"])
    first = book(root, pool, 8, start_in=DAY + HOUR).result
    second = book(root, pool, 8, start_in=DAY + HOUR).result  # the two nodes are full then
    stuck = first if first["nodeId"] == node.id else second
    refused = window(root, node.id, move=True)
    assert (refused.status, refused.code) == (409, "capacity_conflict")
    assert f"reservation {stuck['id']} cannot move off node {node.id}" in \
        refused.body["error"]["message"]
    again = root("reservations.get", reservationId=stuck["id"])
    assert (again["state"], again["nodeId"]) == ("placed", node.id)  # rolled back whole
    assert root("maintenance.list", nodeId=node.id)["items"] == []


LIVE_BOOKINGS_INSIDE_WINDOWS = """
    SELECT count(*) FROM reservations_maintenancewindow w
    JOIN fleet_device d ON d.node_id = w.node_id
    JOIN reservations_booking b ON b.device_id = d.id AND b.during && w.during
    JOIN reservations_allocation a ON a.id = b.allocation_id AND a.ended_at IS NULL
    WHERE w.cancelled_at IS NULL"""


@pytest.mark.django_db(transaction=True)
def test_windows_and_bookings_racing_never_share_a_gpu(root, pool):
    """Two bookers and a window maker race for the same hours of one node, on real
    Postgres. A sampler reads, by the windows' own spans (not their bookings), that no live
    reservation ever holds a GPU inside a live window; both sides won sometimes."""
    import threading

    from django.db import connections

    from compute.core.errors import CapacityConflict, InvalidState
    from compute.platform.tenancy.models import Principal, Tenant
    from reservations.services.book import reservation_create
    from reservations.services.maintenance import maintenance_cancel, maintenance_create
    from reservations.services.release import reservation_release
    from reservations.shape import Shape

    node = make_node(pool["id"])
    tenant = Tenant.objects.get(slug="root")
    actor = Principal.objects.get(pk=root("system.whoami")["principalId"])
    stop, problems, samples = threading.Event(), [], []
    won = {"window": 0, "booking": 0}

    def repeatedly(step) -> None:
        try:
            while not stop.is_set():
                try:
                    step()
                except (CapacityConflict, InvalidState):
                    pass  # the other side held those hours
                except Exception as error:  # anything else is a finding
                    problems.append(repr(error))
        finally:
            connections.close_all()

    def make_window() -> None:
        held, _ = maintenance_create(tenant=tenant, actor=actor, node_id=node.id,
                                     start_in_ms=DAY, duration_ms=2 * HOUR, reason="race")
        won["window"] += 1
        maintenance_cancel(tenant=tenant, actor=actor, window_id=held.id)

    def book_hours() -> None:
        rsv = reservation_create(tenant=tenant, actor=actor, pool_id=pool["id"],
                                 shape=Shape(count=8),
                                 duration_ms=HOUR, start_in_ms=DAY + HOUR // 2)
        if rsv.state == "placed":
            won["booking"] += 1
        reservation_release(tenant=tenant, actor=actor, reservation_id=rsv.id, cancel=True)

    def sample() -> None:
        try:
            while not stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(LIVE_BOOKINGS_INSIDE_WINDOWS)
                    samples.append(cursor.fetchone()[0])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=repeatedly, args=(make_window,)),
               *(threading.Thread(target=repeatedly, args=(book_hours,)) for _ in range(2)),
               threading.Thread(target=sample)]
    for thread in threads:
        thread.start()
    began = time.monotonic()  # 20 s, and on until both sides have won (60 s at most):
    while time.monotonic() - began < 60 and not (  # a loaded machine races more slowly
            time.monotonic() - began >= 20 and min(won.values()) > 5):
        stop.wait(0.5)
    stop.set()
    for thread in threads:
        thread.join(60)
    assert problems == []
    assert len(samples) > 20
    assert set(samples) == {0}  # (a window that booked nothing reads 8 here)
    assert won["window"] > 5, won  # both sides really won hours
    assert won["booking"] > 5, won
    assert overlaps() == 0
