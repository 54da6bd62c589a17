"""`better-compute dev --memory --sim 8`: how long until it is ready, and reserve -> active.

    python -m bench.dev [--reservations 200] [--clients 4]

Ready: from the command's start to its "Ctrl-C stops everything" line (8 simulated nodes
adopted and connected), against a throw-away Postgres started and migrated with nothing
else, measured in the same run. Twice: the first run on a machine migrates (and keeps a copy
of the migrated cluster); the next runs start from that copy. Once ready, a run makes a
spare of that copy for the next one to take by a rename; the bench lets the first run make
it before stopping it, as a run someone used for a while does.

Reserve -> active: `reservations.create` of one GPU from `--clients` clients at once until
`--reservations` exist, each timed from the call to its `reservation.active` event (the
node's signed report, written by the database), against a plain API call (`system.whoami`)
in the same run. Each reservation is released once active, so the GPUs stay free.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import table
from compute.cli.dev import read_env_file

READY_LINE = "Ctrl-C stops everything"


def postgres_floor() -> float:
    """Seconds to start a throw-away Postgres and migrate it."""
    began = time.monotonic()
    code = ("from bench.common import database, django_setup; url, server = database(); "
            "django_setup(); server.stop()")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
                   cwd=Path(__file__).resolve().parent.parent)
    return time.monotonic() - began


def start_dev(folder: Path, port: int, run: str) -> tuple[subprocess.Popen[str], float,
                                                         dict[str, str]]:
    """Start `dev` with its home in `folder` (shared by runs: a later run starts from the
    first run's migrated copy) and its state in a folder of its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BETTER_COMPUTE", "DATABASE_URL"))}
    env["BETTER_COMPUTE_HOME"] = str(folder / "home")
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "compute.cli.main", "dev", "--memory", "--sim", "8", "--port",
         str(port), "--state-dir", str(folder / run)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if line.startswith(READY_LINE):
            break
    else:
        raise RuntimeError("dev exited before it was ready")
    ready = time.monotonic() - began
    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
    return process, ready, read_env_file(folder / run / "env")


class Api:
    def __init__(self, exports: dict[str, str]) -> None:
        self.url = exports["BETTER_COMPUTE_URL"]
        self.client = httpx.Client(timeout=30, headers={
            "Authorization": f"Bearer {exports['BETTER_COMPUTE_TOKEN'].strip()}"})

    def __call__(self, method: str, **body: Any) -> Any:
        answer = self.client.post(f"{self.url}/{method.replace('.', '/')}", json=body).json()
        if not answer["ok"]:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]


def reserve_to_active(exports: dict[str, str], count: int, clients: int) -> list[float]:
    """Seconds from each create call to its reservation's `reservation.active` event."""
    called: dict[str, float] = {}  # reservation id -> wall-clock time of the call
    lock = threading.Lock()
    since = 0

    def client(share: int) -> None:
        api = Api(exports)
        for _ in range(share):
            began = time.time()
            rsv = api("reservations.create", poolId=exports["POOL"], duration=600_000,
                      devices=[{"class": "gpu", "count": 1}])
            with lock:
                called[rsv["id"]] = began
            wait_active(api, rsv["id"])
            api("reservations.release", reservationId=rsv["id"])

    threads = [threading.Thread(target=client, args=(count // clients,))
               for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    active: dict[str, float] = {}
    api = Api(exports)
    while len(active) < len(called):
        page = api("events.list", since=since, limit=1000, types="reservation.active")
        for event in page["items"]:
            if event["type"] == "reservation.active" and event["subject"] in called:
                active[event["subject"]] = datetime.fromisoformat(
                    event["createdAt"].replace("Z", "+00:00")).timestamp()
        if not page["items"]:
            break
        since = page["nextSince"]
    return [active[rid] - called[rid] for rid in called if rid in active]


def wait_active(api: Api, reservation_id: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if api("reservations.get", reservationId=reservation_id)["state"] == "active":
            return
        time.sleep(0.05)
    raise RuntimeError(f"{reservation_id} was not active within 60 s")


def p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reservations", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--port", type=int, default=3191)
    args = parser.parse_args()
    floor = postgres_floor()
    with tempfile.TemporaryDirectory() as folder:
        process, first, _exports = start_dev(Path(folder), args.port, "first")
        migrated, deadline = Path(folder) / "home" / "migrated", time.monotonic() + 60
        while not any(migrated.glob("*.spare")) and time.monotonic() < deadline:
            time.sleep(0.2)
        process.terminate()
        process.wait(60)
        process, ready, exports = start_dev(Path(folder), args.port, "next")
        try:
            api = Api(exports)
            calls = []
            for _ in range(50):
                began = time.monotonic()
                api("system.whoami")
                calls.append(time.monotonic() - began)
            latencies = reserve_to_active(exports, args.reservations, args.clients)
        finally:
            process.terminate()
            process.wait(60)
    baseline = f"Postgres start + migrate {floor:.2f} s"
    print(table([
        {"measure": "dev --memory --sim 8 ready, first run", "p50_s": f"{first:.2f}",
         "p99_s": "-", "baseline": baseline, "x_baseline": f"{first / floor:.2f}"},
        {"measure": "ready, next runs (migrated copy)", "p50_s": f"{ready:.2f}",
         "p99_s": "-", "baseline": baseline, "x_baseline": f"{ready / floor:.2f}"},
        {"measure": f"reserve -> active ({len(latencies)})",
         "p50_s": f"{p(latencies, 50):.3f}", "p99_s": f"{p(latencies, 99):.3f}",
         "baseline": f"system.whoami p50 {p(calls, 50) * 1000:.1f} ms",
         "x_baseline": f"{p(latencies, 50) / p(calls, 50):.1f}"}]))


if __name__ == "__main__":
    main()
