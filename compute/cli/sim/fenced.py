"""Fenced ends in the simulator: the pool fences (`onEnd: fence`), and some reservations get
a workload, a real process on their machine that holds their GPU's device file open, as a
training job would. I6 holds when every reservation that ended after its workload started
has that workload stopped and, where its node's signed released report arrived
(`allocation.released`; one made just before an agent was killed is lost with it), named
there by pid; and when every reservation still running has its workload alive."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from compute.cli.client import ApiError, Client, CliError

ENDED = ("released", "cancelled", "failed")
MAX_WORKLOADS = 8  # real processes held at once by one run
GRACE_SECONDS = 1.0


@dataclass
class Held:
    reservation_id: str
    allocation_id: str
    process: subprocess.Popen[bytes]
    started: datetime  # when the process held the device (the API runs on this host's clock)


def fencing_policy(api: Client, pool_id: str) -> None:
    """The pool fences its ends, with a short grace."""
    policy = api.call("pools.get", {"poolId": pool_id})["policy"]
    api.call("pools.update", {"poolId": pool_id, "policy": {
        **policy, "onEnd": "fence", "fenceGraceSeconds": GRACE_SECONDS}})


class Workloads:
    def __init__(self, api: Client) -> None:
        self.api = api
        self.lock = threading.Lock()
        self.held: list[Held] = []

    def start(self, rsv: dict[str, Any], wait: float) -> bool:
        """A process holding the reservation's GPU once it is active (waiting up to `wait`
        s); False when it did not turn active (or the API was away), or enough run."""
        try:
            return self._start(rsv, wait)
        except (ApiError, CliError):
            return False

    def _start(self, rsv: dict[str, Any], wait: float) -> bool:
        with self.lock:
            if sum(h.process.poll() is None for h in self.held) >= MAX_WORKLOADS:
                return False
        deadline = time.monotonic() + wait
        while rsv.get("state") != "active" and time.monotonic() < deadline:
            time.sleep(0.2)
            rsv = self.api.call("reservations.get", {"reservationId": rsv["id"]})
        if rsv.get("state") != "active" or not rsv.get("binding"):
            return False
        device = device_file(rsv)
        if device is None:
            return False
        code = (f"f = open({str(device)!r}, 'rb')\nprint('open', flush=True)\n"
                "import time\ntime.sleep(3600)\n")
        process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        if process.stdout is None or process.stdout.readline() != b"open\n":
            process.kill()
            return False
        started = datetime.now(UTC)
        with self.lock:
            self.held.append(Held(rsv["id"], rsv["allocationId"], process, started))
        return True

    def judge(self) -> tuple[list[str], int, int]:
        """Problems, and how many workloads were fenced and still run rightly."""
        released = self.api.call("events.list", {"types": "allocation.released",
                                                 "limit": 1000})["items"]
        stopped = {e["subject"]: {w["pid"] for w in e["payload"].get("workloads", {})
                                  .get("stopped", [])} for e in released}
        problems, fenced, running = [], 0, 0
        for held in self.held:
            rsv = self.api.call("reservations.get", {"reservationId": held.reservation_id})
            alive = held.process.poll() is None
            if rsv["state"] not in ENDED:
                running += alive
                if not alive:
                    problems.append(f"{rsv['id']} is {rsv['state']} but its workload "
                                    f"{held.process.pid} was stopped")
                continue
            if rsv["endedAt"] and datetime.fromisoformat(rsv["endedAt"]) < held.started:
                continue  # it ended before its workload held the device: not the node's to see
            if alive:
                problems.append(f"{rsv['id']} ended ({rsv['state']}) but its workload "
                                f"{held.process.pid} still runs")
            elif held.allocation_id in stopped and held.process.pid not in stopped[
                    held.allocation_id]:  # (a report lost with a killed agent says nothing)
                problems.append(f"{rsv['id']}'s workload {held.process.pid} stopped, but "
                                "its node's released report does not name it")
            else:
                fenced += 1
        return problems, fenced, running

    def close(self) -> None:
        for held in self.held:
            held.process.kill()
            held.process.wait()


def device_file(rsv: dict[str, Any]) -> Path | None:
    """The device file of the reservation's first GPU on its simulated machine."""
    root = Path(rsv["binding"]["envFile"]).parents[3]  # <root>/run/bcd/allocations/x.env
    uuid = rsv["binding"]["cdiDevices"][0].split("=", 1)[1]
    status = subprocess.run([sys.executable, "-m", "bcd", "--root", str(root), "status",
                             "--json"], capture_output=True, text=True, timeout=30,
                            check=False)
    if status.returncode != 0:
        return None
    index = next((g["index"] for g in json.loads(status.stdout)["gpus"] if g["uuid"] == uuid),
                 None)
    return None if index is None else root / f"dev/nvidia{index}"
