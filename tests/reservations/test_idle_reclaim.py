"""Idle reclaim: GPU telemetry from the node (through the gateway's service), an offering's
rule, a warning event, then a release with its reason; busy GPUs, or GPUs never reported,
are never reclaimed."""

from __future__ import annotations

import json
import secrets
import time

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from bcd.contract.crypto import canonical, public_pem, sign_bytes
from bcd.contract.holds import Hold
from compute.core.errors import InvalidArgument
from fleet.models import GpuSample, Node, NodeSpec
from fleet.services.telemetry import telemetry_record
from reservations.models import Quota, Reservation
from reservations.services.binding import allocation_bound_record, reservation_bind
from tests.factories import make_node, open_session
from tests.reservations.conftest import reserve
from tests.support.work import run_due_work
from tests.support.writes import assert_wrote

WATCH_S = 6  # forMinutes 0.1
# Each call commits, so the database's clock moves between them as it does in production.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def reclaiming(root, pool, acme):
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8},
         limits={"idleReclaim": {"belowPercent": 5, "forMinutes": 0.1, "release": True,
                                 "graceMinutes": 0}})
    key = ec.generate_private_key(ec.SECP256R1())
    node = make_node(pool["id"])
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
    return key, Node.objects.get(pk=node.pk)


def active(client, pool, key, node, gpus=2):
    """A reservation the node confirmed it holds (its signed report)."""
    rsv = reserve(client, pool, gpus).result
    reservation_bind(reservation_id=rsv["id"])
    hold = next(h for h in NodeSpec.objects.filter(node=node).latest("generation")
                .spec["allocations"] if h["reservationId"] == rsv["id"])
    body = canonical({**Hold.from_wire(hold).binding(), "generation": 2,
                      "nodeId": node.id}).decode()
    allocation_bound_record(node_id=node.id, body=body, signature=sign_bytes(key, body.encode()))
    return Reservation.objects.get(pk=rsv["id"])


def send(node, utilization: dict[str, int]) -> int:
    """The node's readings, as the gateway records them."""
    epoch = Node.objects.get(pk=node.pk).session_epoch
    return telemetry_record(node_id=node.id, epoch=epoch, report_id=secrets.token_hex(8),
                            body=json.dumps(
        {"gpus": {uuid: {"utilization": u, "memoryUsedMiB": 512} for uuid, u in
                  utilization.items()}}))


def gpu_uuids(rsv: Reservation) -> list[str]:
    return list(rsv.allocations.get(ended_at__isnull=True).bookings
                .values_list("device__uuid", flat=True))


def every_gpu(node, utilization: int) -> dict[str, int]:
    return dict.fromkeys(node.devices.filter(device_class="gpu")
                         .values_list("uuid", flat=True), utilization)


def test_an_idle_reservation_is_warned_then_released_with_its_reason(root, pool, acme,
                                                                      reclaiming):
    key, node = reclaiming
    open_session(node.id)
    idle = active(acme, pool, key, node)
    busy = active(acme, pool, key, node)
    readings = {**every_gpu(node, 1), **dict.fromkeys(gpu_uuids(busy), 80)}
    assert send(node, readings) == 8
    run_due_work()  # watched for less than forMinutes: nothing yet
    assert Reservation.objects.get(pk=idle.id).idle_since is None
    time.sleep(WATCH_S + 0.5)
    send(node, readings)
    with assert_wrote(audit="reservation.idle", events=["reservation.idle"]):
        run_due_work()
    flagged = acme("reservations.get", reservationId=idle.id)
    assert flagged["state"] == "active"
    assert flagged["idleSince"] is not None
    warning = acme("events.list", types="reservation.idle")["items"][0]
    assert warning["payload"]["releaseAt"] is not None
    assert "under 5% utilization for 0.1 min" in warning["payload"]["reason"]
    send(node, readings)  # still idle, grace 0: released
    with assert_wrote(audit="reservation.reclaim", events=["reservation.released"]):
        run_due_work()
    released = acme("reservations.get", reservationId=idle.id)
    assert released["state"] == "released"
    assert released["failureReason"].startswith("reclaimed: GPUs under 5% utilization")
    event = acme("events.list", types="reservation.released")["items"][0]
    assert event["payload"]["reason"] == released["failureReason"]
    assert Quota.objects.get(tenant__slug="acme", resource="gpu").used == 2
    # The busy one was never flagged.
    assert acme("reservations.get", reservationId=busy.id)["state"] == "active"
    assert Reservation.objects.get(pk=busy.id).idle_since is None


def test_a_busy_sample_clears_the_flag(root, pool, acme, reclaiming):
    key, node = reclaiming
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8},
         limits={"idleReclaim": {"belowPercent": 5, "forMinutes": 0.1}})  # warn only
    open_session(node.id)
    rsv = active(acme, pool, key, node)
    send(node, every_gpu(node, 0))
    time.sleep(WATCH_S + 0.5)
    send(node, every_gpu(node, 0))
    run_due_work()
    send(node, every_gpu(node, 0))
    run_due_work()  # flagged, and without `release` never released
    assert acme("reservations.get", reservationId=rsv.id)["state"] == "active"
    send(node, every_gpu(node, 60))
    with assert_wrote(audit="reservation.busy", events=["reservation.busy"]):
        run_due_work()
    assert Reservation.objects.get(pk=rsv.id).idle_since is None


def test_gpus_never_reported_are_never_reclaimed(root, pool, acme, reclaiming):
    """No telemetry is no evidence: an agent that sends none (or a node cut off) keeps its
    holds, whatever the rule says."""
    key, node = reclaiming
    open_session(node.id)
    rsv = active(acme, pool, key, node)
    other = make_node(pool["id"])  # reports; the reservation's node does not
    open_session(other.id)
    time.sleep(WATCH_S + 0.5)
    send(other, every_gpu(other, 0))
    run_due_work()
    assert GpuSample.objects.filter(device__node=node).count() == 0
    assert Reservation.objects.get(pk=rsv.id).idle_since is None


@pytest.mark.parametrize(("body", "field"), [
    ({"gpus": []}, "gpus"),
    ({"gpus": {"GPU-x": {"utilization": 101}}}, "gpus.GPU-x.utilization"),
    ({"gpus": {"GPU-x": {"utilization": "hi"}}}, "gpus.GPU-x.utilization"),
    ({"gpus": {"GPU-x": {"utilization": 3, "memoryUsedMiB": -1}}}, "gpus.GPU-x.memoryUsedMiB"),
])
def test_malformed_telemetry_names_its_field_and_stores_nothing(pool, body, field):
    node = make_node(pool["id"])
    epoch = open_session(node.id)
    with pytest.raises(InvalidArgument) as refused:
        telemetry_record(node_id=node.id, epoch=epoch, report_id="t-1", body=json.dumps(body))
    assert refused.value.details["field"] == field
    assert not GpuSample.objects.exists()


def test_idle_reclaim_limits_are_checked(root, pool, acme):
    answer = root.call("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 1},
                       limits={"idleReclaim": {"belowPercent": 500, "forMinutes": 10}})
    assert answer.status == 400
    assert "belowPercent" in json.dumps(answer.body)
