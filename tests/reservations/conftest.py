from __future__ import annotations

import pytest

POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8},
          "hostShare": {"vcpusPerGpu": 12, "memoryGiBPerGpu": 96}}
HOUR = 3_600_000


@pytest.fixture
def pool(root):
    site = root("sites.create", kind="shared", region="eu-1")
    return root("pools.create", siteId=site["id"], gpuModel="H100", policy=POLICY,
                **{"class": "metal-host"})


@pytest.fixture
def cpu_pool(root):
    site = root("sites.create", kind="shared", region="eu-1", idempotencyKey="site")
    return root("pools.create", siteId=site["id"], **{"class": "cpu-host"})


def gpus(count, topology="any"):
    return [{"class": "gpu", "count": count, "topology": topology}]


def reserve(client, pool, count, topology="any", duration=HOUR, **extra):
    return client.call("reservations.create", poolId=pool["id"], devices=gpus(count, topology),
                       duration=duration, **extra)
