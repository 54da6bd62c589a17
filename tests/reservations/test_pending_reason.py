"""A request that fits nowhere says why; simulated machines are shaped like real servers."""

from __future__ import annotations

from bcd.inventory import inventory_for
from tests.factories import make_bare_node, report_inventory
from tests.reservations.conftest import HOUR, reserve
from tests.support.writes import assert_wrote


def simulated_node(pool, variant: str, name: str):
    """A node reporting what a simulated bcd of this variant reports."""
    report = inventory_for(sim=True, sim_gpus=8, sim_variant=variant, hostname=name).report()
    node = make_bare_node(pool["id"])
    report_inventory(node, report)
    node.refresh_from_db()
    return node


def adopt(node) -> None:
    """Pass acceptance (a pool without checks adopts a node at its first inventory)."""
    from django.db import transaction

    from fleet.models import Node
    from fleet.services.nodes import node_adopt_locked

    with transaction.atomic():
        locked = Node.objects.select_for_update().select_related("pool").get(pk=node.pk)
        if locked.provision_state != "adopted":
            node_adopt_locked(locked, checks=["diag.nvml"])


def test_eight_nvlinked_gpus_place_on_a_default_simulated_machine(root, pool):
    adopt(simulated_node(pool, "gpu", "hgx-1"))
    rsv = reserve(root, pool, 8, topology="nvlink-all").result
    assert rsv["state"] == "binding", rsv
    assert rsv["failureReason"] is None


def test_what_no_machine_could_ever_hold_is_refused_at_once_naming_why(root, pool):
    adopt(simulated_node(pool, "gpu-2x4", "pcie-1"))
    cases = [
        ({"topology": "nvlink-all"}, 8, "no machine of the pool has 8 GPUs in one NVLink "
                                        "domain (the largest domain has 4)"),
        ({"product": "A100"}, 4, "no machine of the pool has GPUs that match the request "
                                 "(product, selector, profile); it has: H100-SXM5-80GB"),
        ({"selector": "index >= 6"}, 4, "no machine of the pool has 4 GPUs (the largest "
                                          "has 2)"),
        ({}, 9, "no machine of the pool has 9 GPUs (the largest has 8)"),
    ]
    for extra, count, reason in cases:
        topology = extra.pop("topology", "any")
        devices = [{"class": "gpu", "count": count, "topology": topology}]
        with assert_wrote(audit=None):
            refused = root.call("reservations.create", poolId=pool["id"], duration=HOUR,
                                devices=devices, **extra)
        assert (refused.status, refused.code) == (409, "never_fits"), refused.body
        assert refused.message == reason
        preview = root("capacity.preview", poolId=pool["id"], duration=HOUR, devices=devices,
                       **extra)
        assert (preview["fits"], preview["reason"]) == (False, reason)
    assert root("reservations.list")["items"] == []


def test_a_machine_that_is_away_or_cordoned_still_could_hold_it_so_the_request_waits(
        root, pool):
    node = simulated_node(pool, "gpu", "hgx-away")
    adopt(node)
    root("nodes.cordon", nodeId=node.id)
    rsv = reserve(root, pool, 8, topology="nvlink-all").result
    assert rsv["state"] == "pending"
    assert rsv["failureReason"].startswith("no schedulable node"), rsv


def test_a_pool_without_machines_yet_takes_requests_that_wait(root, pool):
    rsv = root("reservations.create", poolId=pool["id"], duration=HOUR,
               devices=[{"class": "gpu", "count": 8}], product="A100")
    assert rsv["state"] == "pending"


def test_a_busy_pool_says_until_when_and_preview_takes_a_start(root, pool):
    from datetime import datetime

    roomy = root("pools.create", siteId=pool["siteId"], gpuModel="H100",
                 policy={"hostShare": {"vcpusPerGpu": 1, "memoryGiBPerGpu": 1}},
                 **{"class": "metal-host"})
    adopt(simulated_node(roomy, "gpu", "hgx-2"))
    holder = reserve(root, roomy, 8, duration=2 * HOUR).result
    waiting = reserve(root, roomy, 4).result
    assert waiting["state"] == "pending"
    prefix = "all fitting nodes are busy; the first booking in the way ends at "
    assert waiting["failureReason"].startswith(prefix)
    until = datetime.fromisoformat(waiting["failureReason"][len(prefix):])
    assert until == datetime.fromisoformat(holder["end"]).replace(microsecond=0)
    shape = {"poolId": roomy["id"], "duration": HOUR, "devices": [{"class": "gpu", "count": 4}]}
    assert root("capacity.preview", **shape)["fits"] is False
    later = root("capacity.preview", **shape, startIn=2 * HOUR + 60_000)
    assert later["fits"] is True, later
    assert later["window"]["start"] >= holder["end"]
