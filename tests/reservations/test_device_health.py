"""A GPU's health reaches the ledger: an unhealthy GPU (with the node's reason) is never
chosen, `capacity` counts it, events say when it fails and heals, and pool policy
`onDeviceFailure` decides what happens to the reservations booking it."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from audit.models import AuditEvent
from fleet.models import Device, Node
from reservations.models import Booking
from tests.factories import make_node, report_inventory
from tests.reservations.conftest import placed_and_started, reserve
from tests.support.work import run_due_work
from tests.support.writes import recorded

XID_79 = "XID 79: the GPU has fallen off the bus"


def report_health(node: Node, sick: dict[int, str]) -> None:
    """The node's agent reports its inventory again, with these GPUs unhealthy."""
    node.refresh_from_db()
    gpus = [{"uuid": d.uuid, "index": d.index, "product": d.product, "vramGiB": d.vram_gib,
             "nvlinkDomain": d.nvlink_domain,
             **({"health": "unhealthy", "healthReason": sick[d.index]} if d.index in sick
                else {})}
            for d in Device.objects.filter(node=node, device_class="gpu").order_by("index")]
    report_inventory(node, {"hostname": node.hostname, "vcpus": node.vcpus,
                            "memoryGiB": node.memory_gib, "serial": node.serial,
                            "productUuid": node.product_uuid, "gpus": gpus})


def device(node: Node, index: int) -> Device:
    return Device.objects.get(node=node, index=index, device_class="gpu")


def test_an_unhealthy_gpu_is_shown_counted_and_never_chosen(root, pool):
    node = make_node(pool["id"], domains=(8,))
    with recorded() as written:
        report_health(node, {3: XID_79})
    assert "device.unhealthy" in written.events
    shown = {d["index"]: d for d in root("nodes.get", nodeId=node.id)["devices"]}
    assert (shown[3]["health"], shown[3]["healthReason"]) == ("unhealthy", XID_79)
    assert shown[2]["healthReason"] is None
    capacity = root("capacity.get", poolId=pool["id"])
    assert capacity["gpusNotSchedulable"]["unhealthy"] == 1
    assert capacity["gpu"]["available"] == 7
    assert reserve(root, pool, 8).result["state"] == "pending"  # only 7 healthy
    placed = reserve(root, pool, 7).result
    assert placed["state"] == "binding"
    booked = set(Device.objects.filter(bookings__allocation__reservation_id=placed["id"])
                 .values_list("index", flat=True))
    assert 3 not in booked


def test_healing_is_an_event_and_clears_the_reason(root, pool):
    node = make_node(pool["id"])
    report_health(node, {5: "2 volatile uncorrectable ECC error(s)"})
    with recorded() as written:
        report_health(node, {})
    assert written.events.count("device.healthy") == 1
    assert "device.unhealthy" not in written.events
    healed = device(node, 5)
    assert (healed.health, healed.health_reason) == ("healthy", "")


def future_reservation(root, pool, count=8):
    start = (timezone.now() + timedelta(hours=2)).isoformat()
    return reserve(root, pool, count, start=start).result


def with_policy(root, on_failure: str) -> dict:
    site = root("sites.create", kind="shared", region="eu-2")
    return root("pools.create", siteId=site["id"], gpuModel="H100", **{"class": "metal-host"},
                policy={"hostShare": {"vcpusPerGpu": 1, "memoryGiBPerGpu": 1},
                        "onDeviceFailure": on_failure})


def test_replace_future_moves_a_reservation_that_has_not_started_off_the_failed_gpu(root):
    pool = with_policy(root, "replace-future")
    first, second = make_node(pool["id"], domains=(8,)), make_node(pool["id"], domains=(8,))
    rsv = future_reservation(root, pool)
    on = Node.objects.get(pk=rsv["nodeId"])
    other = second if on.pk == first.pk else first
    report_health(on, {0: XID_79})
    with recorded() as written:
        run_due_work()
    moved = root("reservations.get", reservationId=rsv["id"])
    assert (moved["state"], moved["nodeId"]) == ("placed", other.id)
    assert moved["start"] == rsv["start"]  # the same window, before its start
    assert written.audit == ["reservation.replace"]
    assert written.events == ["reservation.replaced", "reservation.placed"]
    assert not Booking.objects.filter(device=device(on, 0)).exists()


def test_replace_future_with_nowhere_to_go_leaves_it_pending_with_the_reason(root):
    pool = with_policy(root, "replace-future")
    node = make_node(pool["id"], domains=(8,))
    rsv = future_reservation(root, pool)
    report_health(node, {6: XID_79})
    run_due_work()
    waiting = root("reservations.get", reservationId=rsv["id"])
    assert waiting["state"] == "pending"
    assert XID_79 in waiting["failureReason"]
    report_health(node, {})  # healed: the pending reservation is placed again
    run_due_work()  # the device item queues the pool's replan
    run_due_work()
    assert root("reservations.get", reservationId=rsv["id"])["state"] == "placed"


def test_keep_leaves_future_bookings_where_they_are(root):
    pool = with_policy(root, "keep")
    make_node(pool["id"], domains=(8,))
    make_node(pool["id"], domains=(8,))
    rsv = future_reservation(root, pool)
    report_health(Node.objects.get(pk=rsv["nodeId"]), {0: XID_79})
    with recorded() as written:
        run_due_work()
    kept = root("reservations.get", reservationId=rsv["id"])
    assert (kept["state"], kept["nodeId"]) == ("placed", rsv["nodeId"])
    assert written.audit == []


def test_a_reservation_holding_the_gpu_now_is_flagged_never_moved(root):
    pool = with_policy(root, "replace-future")
    make_node(pool["id"], domains=(8,))
    make_node(pool["id"], domains=(8,))
    rsv = reserve(root, pool, 8).result  # starts now
    node = Node.objects.get(pk=rsv["nodeId"])
    report_health(node, {4: XID_79})
    with recorded() as written:
        run_due_work()
    still = root("reservations.get", reservationId=rsv["id"])
    assert still["nodeId"] == node.id
    assert "reservation.device_unhealthy" in written.events
    flag = AuditEvent.objects.filter(action="reservation.flag", target=rsv["id"]).get()
    assert XID_79 in flag.reason



def test_a_reservation_whose_window_began_before_its_binding_is_flagged_too(root):
    """The GPU's item may run before the reservation's binding does: it is flagged all the
    same (it will hold the GPU in a moment), never placed again."""
    from reservations.reconcilers import reconcile_device

    pool = with_policy(root, "replace-future")
    make_node(pool["id"], domains=(8,))
    make_node(pool["id"], domains=(8,))
    rsv = placed_and_started(root, pool, 8)
    assert rsv["state"] == "placed"  # its binding has not run yet
    node = Node.objects.get(pk=rsv["nodeId"])
    report_health(node, {2: XID_79})
    with recorded() as written:
        reconcile_device(device(node, 2).id)
    assert written.events == ["reservation.device_unhealthy"]
    assert written.audit == ["reservation.flag"]
    assert root("reservations.get", reservationId=rsv["id"])["nodeId"] == node.id
