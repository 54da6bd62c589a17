"""Fenced ends in the simulator: the pool fences (`onEnd: fence`), and some reservations get
a workload, a real process on their machine that holds their GPU's device file open, as a
training job would. I6 holds when every reservation that ended after its workload started
has that workload stopped and, where its node's signed released report arrived
(`allocation.released`; one made just before an agent was killed is lost with it), named
there by pid; and when every reservation still running has its workload alive, until it
is released at the end of the run and its workload is stopped too."""

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

    def start(self, rsv: dict[str, Any], wait: float) -> str:
        """A process holding the reservation's GPU once it is active (waiting up to `wait`
        s); the outcome, in words."""
        with self.lock:
            if sum(h.process.poll() is None for h in self.held) >= MAX_WORKLOADS:
                return "workload not started: enough run"
        deadline = time.monotonic() + wait
        while rsv.get("state") != "active" and time.monotonic() < deadline:
            time.sleep(1.0)
            try:
                rsv = self.api.call("reservations.get", {"reservationId": rsv["id"]})
            except (ApiError, CliError):
                continue  # away, or too many requests: asked again
        if rsv.get("state") != "active" or not rsv.get("binding"):
            return f"workload not started: {rsv.get('state')}"
        device = device_file(rsv)
        if device is None:
            return "workload not started: no device file"
        code = (f"f = open({str(device)!r}, 'rb')\nprint('open', flush=True)\n"
                "import time\ntime.sleep(3600)\n")
        process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        if process.stdout is None or process.stdout.readline() != b"open\n":
            process.kill()
            return "workload not started: the device file did not open"
        started = datetime.now(UTC)
        with self.lock:
            self.held.append(Held(rsv["id"], rsv["allocationId"], process, started))
        return "workload started"

    def judge(self, settle: float) -> tuple[list[str], int, int]:
        """Problems, how many workloads were stopped rightly, and how many ran rightly on
        live holds. Those live holds are then released (the tenants go home), and their
        workloads must be stopped within `settle` s too."""
        problems, live, checked = [], [], 0
        for held in self.held:
            rsv = self.api.call("reservations.get", {"reservationId": held.reservation_id})
            if rsv["state"] in ENDED:
                if rsv["endedAt"] and datetime.fromisoformat(rsv["endedAt"]) < held.started:
                    continue  # it ended before its workload held the device: not seen
                checked += 1
                problems += self.stopped(held, rsv)
            elif held.process.poll() is not None:
                problems.append(f"{rsv['id']} is {rsv['state']} but its workload "
                                f"{held.process.pid} was stopped")
            else:
                live.append(held)
        for held in live:
            self.api.call("reservations.release", {"reservationId": held.reservation_id})
        deadline = time.monotonic() + settle
        while any(h.process.poll() is None for h in live) and time.monotonic() < deadline:
            time.sleep(0.2)
        for held in live:
            problems += self.stopped(held, self.api.call(
                "reservations.get", {"reservationId": held.reservation_id}))
        return problems, checked + len(live) - len(problems), len(live)

    def stopped(self, held: Held, rsv: dict[str, Any]) -> list[str]:
        """Whether the ended reservation's workload was stopped and, where its node's
        released report arrived (one made just before its agent was killed is lost with
        it), named there."""
        if held.process.poll() is None:
            return [f"{rsv['id']} ended ({rsv['state']}) but its workload "
                    f"{held.process.pid} still runs"]
        events = self.api.call("events.list", {"types": "allocation.released",
                                               "subject": held.allocation_id})["items"]
        named = [{w["pid"] for w in e["payload"].get("workloads", {}).get("stopped", [])}
                 for e in events]
        if named and held.process.pid not in set().union(*named):
            return [f"{rsv['id']}'s workload {held.process.pid} stopped, but its node's "
                    "released report does not name it"]
        return []

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
