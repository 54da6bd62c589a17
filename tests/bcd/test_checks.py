"""Acceptance checks that look: each one fails for its reason, with words that say it (too
few vCPUs, a read-only state directory, no route to the gateway, a missing or sick GPU,
no DCGM), and passes on a machine that is fine."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bcd.agent import Agent
from bcd.config import Config, Paths
from bcd.inventory.faults import faults_file, inject

POLICY = {"expect": {"gpuCount": 8}, "hostShare": {"vcpusPerGpu": 12, "memoryGiBPerGpu": 96}}


def check(root: Path | Agent, kind: str, payload: dict | None = None,
          **config) -> tuple[str, dict]:
    agent = root if isinstance(root, Agent) else Agent(Config.read(Paths(root).config_file))
    if config:
        agent.config = Config(**{**agent.config.__dict__, **config})
    return asyncio.run(agent._execute(kind, {**POLICY, **(payload or {})}))


@pytest.fixture
def listening() -> Iterator[str]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


def test_a_fine_machine_passes_every_check(root, listening):
    Paths(root).state_dir.mkdir(parents=True, exist_ok=True)
    for kind in ("diag.nvml", "diag.cpu", "diag.disk"):
        assert check(root, kind)[0] == "succeeded", kind
    status, output = check(root, "diag.network", gateway=listening)
    assert status == "succeeded"
    assert output["rttMs"] < 500


def test_nvml_fails_for_a_missing_gpu(root):
    status, output = check(root, "diag.nvml", {"expect": {"gpuCount": 10}})
    assert status == "failed"
    assert output["error"] == "8 GPU(s) present, the pool expects 10"


def test_nvml_fails_for_a_sick_gpu_and_names_it(root):
    inject(faults_file(root), 5, "ecc")
    status, output = check(root, "diag.nvml")
    assert status == "failed"
    assert output["error"] == "GPU 5 1 volatile uncorrectable ECC error(s)"
    assert output["healthyGpus"] == 7


def test_cpu_fails_with_too_few_vcpus_or_too_little_memory(root):
    status, output = check(root, "diag.cpu", {"hostShare": {"vcpusPerGpu": 16,
                                                            "memoryGiBPerGpu": 1}})
    assert status == "failed"
    assert output["error"] == "96 vCPUs; the pool's host share needs 128 for 8 GPU(s)"
    status, output = check(root, "diag.cpu", {"hostShare": {"vcpusPerGpu": 1,
                                                            "memoryGiBPerGpu": 256}})
    assert output["error"] == ("1024 GiB of memory; the pool's host share needs 2048 GiB "
                               "for 8 GPU(s)")


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """The directory on a read-only file system (root ignores permission bits)."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(directory)],
                   check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_disk_fails_on_a_read_only_state_directory(root):
    state = Paths(root).state_dir
    agent = Agent(Config.read(Paths(root).config_file))  # its journal opened before
    with read_only(state):
        status, output = check(agent, "diag.disk")
    assert status == "failed"
    assert output["error"] == (f"the state directory {state} is not writable: "
                               "Read-only file system")


def test_disk_fails_without_the_free_space_asked_for(root):
    Paths(root).state_dir.mkdir(parents=True, exist_ok=True)
    status, output = check(root, "diag.disk", {"params": {"minFreeGiB": 10**9}})
    assert status == "failed"
    assert "GiB free under" in output["error"]
    assert "at least 1e+09 GiB needed" in output["error"]


def test_network_fails_without_a_route_to_the_gateway(root):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
    status, output = check(root, "diag.network", gateway=nobody)
    assert status == "failed"
    assert output["error"].startswith(f"the gateway {nobody} is unreachable")
    assert "refused" in output["error"].lower()


def test_dcgm_fails_clearly_when_it_is_not_installed(root, monkeypatch):
    monkeypatch.setenv("PATH", str(root))  # no dcgmi here
    status, output = check(root, "diag.dcgm")
    assert status == "failed"
    assert output["error"].startswith("DCGM is not installed")
