"""Acceptance checks a pool runs on a joining machine. Each looks at the machine and, when it
fails, says why in words an operator can act on (shown under `nodes get` conditions).

- diag.nvml: every expected GPU present and healthy, as many as the pool expects.
- diag.cpu: vCPUs and memory enough for the pool's host share of every GPU.
- diag.disk: the agent's state directory writable, with the free space asked for.
- diag.network: the gateway reachable, with a measured round trip under the limit.
- diag.dcgm: NVIDIA DCGM's quick diagnostic (`dcgmi diag -r 1`), when DCGM is installed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bcd.inventory import InventorySource

Result = tuple[str, dict[str, Any]]
PASSED, FAILED = "succeeded", "failed"


def _failed(reason: str, **observed: Any) -> Result:
    return FAILED, {"error": reason, **observed}


def diag_nvml(inventory: InventorySource, payload: dict[str, Any]) -> Result:
    gpus = inventory.report().get("gpus", [])
    expected = int(payload.get("expect", {}).get("gpuCount", 0))
    sick = [f"GPU {g['index']} {g.get('healthReason') or 'unhealthy'}" for g in gpus
            if g.get("health", "healthy") != "healthy"]
    healthy = len(gpus) - len(sick)
    observed = {"gpus": len(gpus), "healthyGpus": healthy, "expected": expected}
    if expected and len(gpus) != expected:
        return _failed(f"{len(gpus)} GPU(s) present, the pool expects {expected}", **observed)
    if sick:
        return _failed("; ".join(sick), **observed)
    return PASSED, observed


def diag_cpu(inventory: InventorySource, payload: dict[str, Any]) -> Result:
    report = inventory.report()
    share = payload.get("hostShare", {})
    gpus = int(payload.get("expect", {}).get("gpuCount", 0)) or len(report.get("gpus", []))
    need_vcpus = gpus * int(share.get("vcpusPerGpu", 0))
    need_memory = gpus * int(share.get("memoryGiBPerGpu", 0))
    observed = {"vcpus": report["vcpus"], "memoryGiB": report["memoryGiB"],
                "needVcpus": need_vcpus, "needMemoryGiB": need_memory}
    if report["vcpus"] < need_vcpus:
        return _failed(f"{report['vcpus']} vCPUs; the pool's host share needs {need_vcpus} "
                       f"for {gpus} GPU(s)", **observed)
    if report["memoryGiB"] < need_memory:
        return _failed(f"{report['memoryGiB']} GiB of memory; the pool's host share needs "
                       f"{need_memory} GiB for {gpus} GPU(s)", **observed)
    return PASSED, observed


def diag_disk(state_dir: Path, payload: dict[str, Any]) -> Result:
    need = float(payload.get("params", {}).get("minFreeGiB", 1))
    try:
        with tempfile.NamedTemporaryFile(dir=state_dir, prefix=".diag-disk-") as probe:
            probe.write(b"x" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        return _failed(f"the state directory {state_dir} is not writable: "
                       f"{error.strerror or error}")
    free = shutil.disk_usage(state_dir).free / 2**30
    observed = {"freeGiB": round(free, 1), "minFreeGiB": need}
    if free < need:
        return _failed(f"{free:.1f} GiB free under {state_dir}; at least {need:g} GiB needed",
                       **observed)
    return PASSED, observed


def diag_network(gateway: str, payload: dict[str, Any]) -> Result:
    """Connect to the gateway's session address and time it (the round trip of a TCP
    handshake): no route, a refusal or a slow path fails with what was seen."""
    limit = float(payload.get("params", {}).get("maxRttMs", 500))
    host, _, port = gateway.rpartition(":")
    started = time.monotonic()
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=3):
            rtt = (time.monotonic() - started) * 1000
    except (OSError, ValueError) as error:
        return _failed(f"the gateway {gateway} is unreachable: {error}")
    observed = {"gateway": gateway, "rttMs": round(rtt, 2), "maxRttMs": limit}
    if rtt > limit:
        return _failed(f"the gateway {gateway} answers in {rtt:.0f} ms, more than {limit:g}",
                       **observed)
    return PASSED, observed


def diag_dcgm(payload: dict[str, Any]) -> Result:
    binary = shutil.which("dcgmi")
    if binary is None:
        return _failed("DCGM is not installed (no dcgmi on PATH): install datacenter-gpu-"
                       "manager or remove diag.dcgm from the pool's acceptance")
    try:
        run = subprocess.run([binary, "diag", "-r", "1"], capture_output=True, text=True,
                             timeout=float(payload.get("params", {}).get("timeoutSeconds", 300)),
                             check=False)
    except subprocess.TimeoutExpired:
        return _failed("dcgmi diag -r 1 did not finish in time")
    tail = (run.stdout + run.stderr).strip().splitlines()[-5:]
    if run.returncode != 0:
        return _failed(f"dcgmi diag -r 1 failed (exit {run.returncode})", output=tail)
    return PASSED, {"output": tail}
