"""MIG instances and GPU shares end to end, with the real CLI against
`dev --memory --sim 1 --sim-variant mig` (a simulated HGX whose GPUs 0-3 are in MIG mode,
answering NVML's MIG calls, in a pool that slices its other GPUs in four shares): the real
agent binds what the ledger booked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.test_tutorial_cli import booked_uuids, node_root
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("mig"), "--sim", "1", "--sim-variant", "mig")
    yield running
    stop_stack(running)


def parts(stack: Stack) -> dict[str, dict]:
    rollup = stack.json("capacity", "--pool", stack.env["POOL"])
    return {row["profile"] or row["class"]: row for row in rollup["parts"]}


def test_the_simulated_node_reports_its_mig_instances_and_shares(stack):
    found = parts(stack)
    assert (found["1g.10gb"]["total"], found["3g.40gb"]["total"]) == (14, 4)
    assert found["gpu-share"]["total"] == 16  # GPUs 4-7, four shares each
    node = stack.json("nodes", "list")["items"][0]
    devices = stack.json("nodes", "get", node["id"])["devices"]
    mig = [d for d in devices if d["class"] == "mig"]
    assert all(d["uuid"].startswith("MIG-") and d["parentId"] for d in mig)


def test_mig_instances_are_bound_as_cdi_devices(stack):
    rsv = stack.json("reserve", "--pool", stack.env["POOL"], "--mig", "1g.10gb", "--gpus", "2",
                     "--for", "1h")
    assert rsv["state"] == "active", rsv["failureReason"]
    booked = booked_uuids(stack, rsv["id"])
    assert len(booked) == 2
    assert all(uuid.startswith("MIG-") for uuid in booked)
    spec = json.loads((node_root(stack, rsv["nodeId"]) / "etc" / "cdi"
                       / f"bcd-{rsv['allocationId']}.json").read_text())
    assert sorted(d["name"] for d in spec["devices"]) == booked
    assert rsv["binding"]["cdiDevices"] == [f"bcd.dev/gpu={uuid}" for uuid in booked]
    assert parts(stack)["1g.10gb"]["available"] == 12
    # The GPU those instances are part of is not free for a whole booking now.
    whole = stack.json("capacity", "--pool", stack.env["POOL"])["gpu"]
    assert whole["available"] == 7
    assert stack.ok("release", rsv["id"], "--query", "state") == "released"
    assert parts(stack)["1g.10gb"]["available"] == 14


def test_a_share_is_bound_as_its_gpu_with_the_share_named(stack):
    rsv = stack.json("reserve", "--pool", stack.env["POOL"], "--share", "--gpus", "1",
                     "--for", "1h")
    assert rsv["state"] == "active", rsv["failureReason"]
    share = booked_uuids(stack, rsv["id"])[0]
    gpu, _, slot = share.partition(":share-")
    assert gpu.startswith("GPU-")
    assert slot == "1"
    assert rsv["binding"]["cdiDevices"] == [f"bcd.dev/gpu={gpu}"]
    assert rsv["binding"]["shares"] == [share]
    env_file = Path(rsv["binding"]["envFile"])
    assert f"BCD_GPU_SHARES={share}" in env_file.read_text()
    assert f"NVIDIA_VISIBLE_DEVICES={gpu}" in env_file.read_text()
    assert parts(stack)["gpu-share"]["available"] == 15
    assert stack.ok("release", rsv["id"], "--query", "state") == "released"
    assert wait_until(lambda: not env_file.exists())


def test_the_cli_refuses_mixed_atoms_before_asking(stack):
    result = stack.cli("reserve", "--pool", stack.env["POOL"], "--share", "--mig", "1g.10gb",
                       "--gpus", "1", "--for", "1h")
    assert result.returncode == 2
    assert "--mig and --share" in result.stderr
