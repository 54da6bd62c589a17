"""capacity.get and capacity.preview."""

from __future__ import annotations

from fleet.models import Node, ProvisionState
from reservations.models import Booking, Reservation
from tests.factories import make_node, make_unreachable
from tests.reservations.conftest import HOUR, gpus, reserve


def test_one_adopted_server_gives_eight_allocatable_gpus(root, pool):
    make_node(pool["id"])
    capacity = root("capacity.get", poolId=pool["id"])
    assert capacity["gpu"] == {"total": 8, "allocatable": 8, "allocated": 0, "reserved": 0,
                               "available": 8}
    assert capacity["vcpu"]["available"] == 96


def test_capacity_counts_held_future_and_unschedulable_gpus(root, pool):
    held = make_node(pool["id"])
    reserve(root, pool, 4)
    reserve(root, pool, 2, startIn=2 * HOUR)
    make_node(pool["id"], adopted=False)
    cordoned = make_node(pool["id"])
    root("nodes.cordon", nodeId=cordoned.id)
    gone = make_node(pool["id"])
    make_unreachable(gone)
    capacity = root("capacity.get", poolId=pool["id"])
    assert capacity["gpu"] == {"total": 32, "allocatable": 8, "allocated": 4, "reserved": 2,
                               "available": 4}
    assert capacity["gpusNotSchedulable"] == {"provisioning": 8, "unhealthy": 0,
                                              "maintenance": 8, "unreachable": 8}
    assert Node.objects.get(pk=held.pk).provision_state == ProvisionState.ADOPTED


def test_preview_books_nothing_and_names_the_host_share(root, pool):
    node = make_node(pool["id"])
    preview = root("capacity.preview", poolId=pool["id"], devices=gpus(4), duration=2 * HOUR)
    assert preview["fits"] is True
    assert preview["nodeId"] == node.id
    assert (preview["vcpus"], preview["memoryGiB"]) == (48, 384)
    assert len(preview["devices"]) == 4
    assert len(preview["nvlinkDomains"]) == 1
    assert not Booking.objects.exists()
    assert not Reservation.objects.exists()
    too_big = root("capacity.preview", poolId=pool["id"], devices=gpus(9), duration=HOUR)
    assert too_big["fits"] is False
