"""What still runs on a hold's devices when the hold ends, and, where the pool's policy says
`onEnd: fence`, stopping it before the devices are held by anyone else.

A hold's workloads are the processes that have one of its whole GPUs' device files open
(`/proc/<pid>/fd`, the GPU's `/dev/nvidia<index>` under the node's root) or that run in its
cgroup (the slice, or the cgroupfs path where systemd does not run; `/proc/<pid>/cgroup`).
A MIG instance or a share of a GPU is found by the cgroup only: the GPU's device file is open
in the other tenants' processes too. Fencing sends SIGTERM, waits the grace period for them
to exit, then SIGKILL; `notify` leaves them running and says which they are.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcd.config import Paths
from bcd.contract.holds import Hold

PROC = Path("/proc")
MAX_LISTED = 64  # workloads named in one report
SETTLE = 2.0  # seconds SIGKILL is given to take effect


@dataclass(frozen=True)
class Workload:
    pid: int
    command: str
    why: str  # "device /dev/nvidia3" or "cgroup"

    def wire(self, **extra: Any) -> dict[str, Any]:
        return {"pid": self.pid, "command": self.command, "why": self.why, **extra}


def device_files(hold: Hold, paths: Paths, gpu_index: dict[str, int]) -> dict[str, str]:
    """The device files of the GPUs the hold holds whole, where they are on this host, each
    with the path a workload sees."""
    split = {share.partition(":share-")[0] for share in hold.shares}
    files = {}
    for uuid in hold.gpus:
        if uuid.startswith("GPU-") and uuid not in split and uuid in gpu_index:
            seen = f"/dev/nvidia{gpu_index[uuid]}"
            files[str(paths.root / seen.lstrip("/"))] = seen
    return files


def in_cgroup(pid: str, hold: Hold) -> bool:
    try:
        lines = (PROC / pid / "cgroup").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        where = line.split(":", 2)[-1]
        if where == hold.cgroupfs_path or where.startswith(hold.cgroupfs_path + "/") or \
                f"/{hold.slice_name}" in where:
            return True
    return False


def workloads_of(hold: Hold, paths: Paths, gpu_index: dict[str, int]) -> list[Workload]:
    """Every process (but this agent) that holds one of the hold's devices or runs in its
    cgroup, found now."""
    files = device_files(hold, paths, gpu_index)
    found = []
    for pid in os.listdir(PROC):  # plain strings: this reads every open file on the machine
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        why = ""
        fds = f"{PROC}/{pid}/fd"
        try:
            for fd in os.listdir(fds):
                target = os.readlink(f"{fds}/{fd}")
                if target in files:
                    why = f"device {files[target]}"
                    break
        except OSError:  # gone, or not ours to read
            pass
        if not why and in_cgroup(pid, hold):
            why = "cgroup"
        if why:
            found.append(Workload(int(pid), command_of(pid), why))
    return sorted(found, key=lambda w: w.pid)


def command_of(pid: str) -> str:
    try:
        raw = (PROC / pid / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def alive(pid: int) -> bool:
    """Whether the process still runs (a zombie has ended: it only waits to be reaped)."""
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Those of `pids` still alive after waiting up to `seconds`."""
    deadline = time.monotonic() + seconds
    left = [pid for pid in pids if alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if alive(pid)]
    return left


def send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def end_workloads(hold: Hold, paths: Paths, gpu_index: dict[str, int]) -> dict[str, Any]:
    """What the released report says of the hold's workloads: with `fence`, those stopped
    (and by which signal) and any that survived SIGKILL; with `notify`, those left running."""
    found = workloads_of(hold, paths, gpu_index)
    if hold.on_end != "fence":
        return {"onEnd": hold.on_end,
                "running": [w.wire() for w in found[:MAX_LISTED]]}
    for workload in found:
        send(workload.pid, signal.SIGTERM)
    stubborn = set(wait_gone([w.pid for w in found], hold.fence_grace))
    for pid in stubborn:
        send(pid, signal.SIGKILL)
    survived = set(wait_gone(list(stubborn), SETTLE))
    late = [w for w in workloads_of(hold, paths, gpu_index)
            if w.pid not in {f.pid for f in found}]  # started while it was being fenced
    for workload in late:
        send(workload.pid, signal.SIGKILL)
    survived |= set(wait_gone([w.pid for w in late], SETTLE))
    stopped = [w.wire(signal="SIGKILL" if w.pid in stubborn or w in late else "SIGTERM")
               for w in [*found, *late] if w.pid not in survived]
    return {"onEnd": "fence", "stopped": stopped[:MAX_LISTED],
            "survived": [w.wire() for w in [*found, *late] if w.pid in survived][:MAX_LISTED],
            "graceSeconds": hold.fence_grace}
