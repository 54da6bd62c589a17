"""Sandboxes share the host counters with GPU reservations' host share."""

from __future__ import annotations

import pytest
from django.db import connection

from fleet.models import Node
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.writes import assert_wrote


def test_sandbox_claims_vcpus_on_a_cpu_pool(root, cpu_pool):
    node = make_node(cpu_pool["id"], gpus=0, vcpus=32, memory_gib=128)
    with assert_wrote(audit="sandbox.create", events=["sandbox.created"]):
        sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=8, memoryGiB=16)
    assert (sandbox["nodeId"], sandbox["state"]) == (node.id, "running")
    node.refresh_from_db()
    assert (node.vcpus_allocated, node.memory_gib_allocated) == (8, 16)
    with assert_wrote(audit=None):
        answer = root.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=30, memoryGiB=16)
    assert (answer.status, answer.code) == (409, "capacity_conflict")


def test_sandbox_and_gpu_host_share_never_take_each_others(root, pool):
    make_node(pool["id"])  # 96 vCPUs; 12 per GPU
    root("sandboxes.create", poolId=pool["id"], vcpus=60, memoryGiB=64)
    assert reserve(root, pool, 4).result["state"] == "pending"  # 48 > 36 left
    assert reserve(root, pool, 3).result["state"] == "placed"  # 36 fit exactly
    answer = root.call("sandboxes.create", poolId=pool["id"], vcpus=1, memoryGiB=1)
    assert answer.code == "capacity_conflict"


@pytest.mark.django_db(transaction=True)
def test_release_meters_vcpu_hours_and_gives_back(root, cpu_pool):
    node = make_node(cpu_pool["id"], gpus=0, vcpus=32, memory_gib=128)
    sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=8, memoryGiB=16)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE reservations_sandbox SET created_at = now() - interval '30 min'")
    with assert_wrote(audit="sandbox.release", events=["sandbox.released"]):
        released = root("sandboxes.release", sandboxId=sandbox["id"])
    assert released["state"] == "released"
    assert Node.objects.get(pk=node.pk).vcpus_allocated == 0
    usage = root("usage.list", meter="vcpu.hours")["items"]
    assert len(usage) == 1
    assert 3.99 < float(usage[0]["quantity"]) < 4.01


def test_cpu_pool_offering_takes_vcpu_and_memory_quotas(root, cpu_pool, acme):
    make_node(cpu_pool["id"], gpus=0, vcpus=32, memory_gib=128)
    root("pools.offer", poolId=cpu_pool["id"], to="acme", quota={"vcpu": 8, "memory": 32})
    assert acme.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=8, memoryGiB=16).ok
    answer = acme.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=1, memoryGiB=1)
    assert answer.code == "quota_exceeded"
    gpu = root.call("pools.offer", poolId=cpu_pool["id"], to="acme", quota={"gpu": 1})
    assert gpu.code == "invalid_argument"
