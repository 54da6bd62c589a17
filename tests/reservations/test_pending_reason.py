"""A request that fits nowhere says why; simulated machines are shaped like real servers."""

from __future__ import annotations

from bcd.inventory import inventory_for
from tests.factories import make_bare_node, report_inventory
from tests.reservations.conftest import HOUR, reserve


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
    assert rsv["state"] == "placed", rsv
    assert rsv["failureReason"] is None


def test_two_by_four_machines_say_why_eight_nvlinked_gpus_stay_pending(root, pool):
    adopt(simulated_node(pool, "gpu-2x4", "pcie-1"))
    rsv = reserve(root, pool, 8, topology="nvlink-all").result
    assert rsv["state"] == "pending"
    assert rsv["failureReason"] == ("no node has 8 GPUs in one NVLink domain (the largest "
                                    "domain has 4)")
    preview = root("capacity.preview", poolId=pool["id"], duration=HOUR,
                   devices=[{"class": "gpu", "count": 8, "topology": "nvlink-all"}])
    assert (preview["fits"], preview["reason"]) == (False, rsv["failureReason"])


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
