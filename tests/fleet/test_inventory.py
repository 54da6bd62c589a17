"""Inventory reports derive devices idempotently; a pool holds one GPU model."""

from __future__ import annotations

import pytest

from compute.core.errors import InvalidArgument
from fleet.inventory import gpu_family, parse_inventory
from fleet.models import Device, Node
from fleet.services.nodes import InventoryRefused
from tests.factories import inventory, make_bare_node, make_node, report_inventory
from tests.support.writes import assert_wrote


@pytest.mark.parametrize(("product", "family"), [
    ("H100-SXM5-80GB", "H100"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA RTX 6000 Ada Generation", "RTX-6000"),
    ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA L40S", "L40S"),
])
def test_gpu_family(product, family):
    assert gpu_family(product) == family


@pytest.fixture
def gpu_pool(root):
    site = root("sites.create", kind="shared", region="eu-1")
    pool = root("pools.create", siteId=site["id"], gpuModel="H100", **{"class": "metal-host"})
    from fleet.models import Pool

    return Pool.objects.get(pk=pool["id"])


def test_ingest_is_idempotent_and_marks_missing_devices_absent(gpu_pool):
    report = inventory()
    node = make_bare_node(gpu_pool)
    with assert_wrote(audit=["node.session.open", "node.inventory"],
                      events=["node.connected", "node.inventory.updated",
                              "node.acceptance.started", "node.adopted"]):
        report_inventory(node, report)
    with assert_wrote(audit=["node.session.open", "node.inventory"],
                      events=["node.inventory.updated"]):
        report_inventory(node, report)
    assert Device.objects.filter(node=node, present=True).count() == 8
    report["gpus"] = report["gpus"][:7]
    report_inventory(node, report)
    assert Device.objects.filter(node=node, present=True).count() == 7
    assert Device.objects.filter(node=node).count() == 8
    assert Node.objects.get(pk=node.pk).inventory_generation == 3


def test_a_node_with_another_gpu_model_is_refused_with_a_reason(gpu_pool):
    node = make_bare_node(gpu_pool)
    with pytest.raises(InventoryRefused) as caught, assert_wrote(audit="node.session.open",
                                                                events=["node.connected"]):
        report_inventory(node, inventory(product="A100-SXM4-80GB"))
    assert "A100" in caught.value.message
    assert not Device.objects.filter(node=node).exists()


def test_a_device_cannot_move_between_nodes(gpu_pool):
    report = inventory()
    make_node(gpu_pool, **{})
    first = make_bare_node(gpu_pool)
    report_inventory(first, report)
    second = make_bare_node(gpu_pool)
    with pytest.raises(InventoryRefused):
        report_inventory(second, report)


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda r: r.pop("vcpus"), "vcpus"),
    (lambda r: r.update(vcpus=-1), "vcpus"),
    (lambda r: r["gpus"][2].pop("uuid"), "gpus[2].uuid"),
    (lambda r: r["gpus"][1].update(uuid=r["gpus"][0]["uuid"]), "gpus"),
    (lambda r: r.update(macs=["zz:zz"]), "macs"),
])
def test_bad_reports_name_the_field(mutate, field):
    report = inventory()
    mutate(report)
    with pytest.raises(InvalidArgument) as caught:
        parse_inventory(report)
    assert caught.value.details["field"] == field
