"""What a user of `better-compute dev --memory --sim 8` sees, measured from outside it.

    python -m bench.stack [--seconds 8] [--clients 1,8,32] [--reservations 60]

The whole stack as the README starts it (API, gateway, workers, eight simulated machines),
driven by client processes over plain HTTP:

- bookings/s and p50/p99 of `reservations.create` (4 GPUs, one hour, starts spread over
  four weeks) at each client count, with a new connection per request (as the CLI and most HTTP
  clients do) and with one kept-alive connection per client;
- reserve -> active as the client sees it, first, on the fresh stack once it went quiet
  (its start's own work done): create, then `reservations.get` every 20 ms until it says
  `active` (4 clients);
- in the same run, the raw-SQL booking ceiling on the stack's own database (one INSERT per
  transaction, same table and EXCLUDE constraint, no placement), and then the API alone
  (bench.booking's HTTP figure, kept-alive connections, with its own raw ceiling);
- where the CPU went while the clients booked: API, Postgres, workers, gateway, agents and
  the clients themselves, in CPU milliseconds per booking;
- the CLI's wall time (`--version`, `api system.whoami`), the stack's memory (RSS and PSS by
  process kind), and the time to ready: the first start (which migrates) and a second one
  from the migrated copy, as a user's next `dev` starts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.common import table
from bench.dev import start_dev

SPREAD_MS = 28 * 24 * 3_600_000  # four weeks: the runs' bookings never fill the pool
KINDS = ("api", "postgres", "worker", "qcluster", "gateway", "agent", "dev")


def kind_of(pid: int) -> str | None:
    """Which part of the stack a process is, from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    for kind, marks in (("postgres", ("postgres",)), ("agent", ("-m bcd", "bin/bcd")),
                        ("gateway", ("-m gateway",)), ("qcluster", ("qcluster",)),
                        ("worker", ("bc_worker",)),
                        ("api", ("gunicorn", "uvicorn", "compute.cli.main serve", " serve "))):
        if any(mark in argv for mark in marks):
            return kind
    return "dev" if "compute.cli.main dev" in argv else None


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def stack_processes(dev_pid: int, data_dir: str) -> dict[int, str]:
    """The stack's processes by kind: dev's descendants, and the embedded Postgres (started
    with pg_ctl, so not dev's child): the postmaster of its data folder and its backends."""
    found = {pid: kind_of(pid) for pid in descendants(dev_pid)}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if data_dir and f"-D {data_dir}" in argv:
                found.update(dict.fromkeys(descendants(int(entry.name)), "postgres"))
    return {pid: kind for pid, kind in found.items() if kind}


def data_dir_of(url: str) -> str:
    """The embedded server's data folder: its socket's folder, the URL's `host`."""
    from urllib.parse import parse_qs, urlsplit

    return parse_qs(urlsplit(url).query).get("host", [""])[0]


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int, field: str) -> float:
    """A process's `Rss` or `Pss` (its shared pages divided among their sharers: forked
    workers and Postgres's backends share most of theirs, which RSS counts in each)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def by_kind(processes: dict[int, str], value: Any) -> dict[str, float]:
    totals = dict.fromkeys(KINDS, 0.0)
    for pid, kind in processes.items():
        totals[kind] += value(pid)
    return totals


def book_loop(args: tuple[str, str, str, float, bool, int]) -> list[float]:
    """One client process: create bookings until the deadline; each one's latency."""
    url, token, pool, seconds, keep_alive, seed = args
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {token}"}
    # Without keep-alive, each request opens a TCP connection of its own and closes it
    # after, as curl or one CLI command does. (A new httpx client per request would also
    # load a CA bundle each time: tens of ms of the clients' CPU, on the stack's cores.)
    limits = None if keep_alive else httpx.Limits(max_keepalive_connections=0)
    client = httpx.Client(timeout=30, headers=headers, **({"limits": limits} if limits else {}))
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        body = {"poolId": pool, "devices": [{"class": "gpu", "count": 4}],
                "duration": 3_600_000, "startIn": rng.randrange(60_000, SPREAD_MS)}
        began = time.monotonic()
        answer = client.post(f"{url}/reservations/create", json=body)
        if answer.status_code == 200:
            latencies.append(time.monotonic() - began)
    return latencies


def bookings(exports: dict[str, str], clients: int, seconds: float, keep_alive: bool,
             processes: dict[int, str]) -> dict[str, Any]:
    work = [(exports["BETTER_COMPUTE_URL"], exports["BETTER_COMPUTE_TOKEN"].strip(),
             exports["POOL"], seconds, keep_alive, n) for n in range(clients)]
    cpu_before = by_kind(processes, cpu_seconds)
    own_before = os.times()
    began = time.monotonic()
    with multiprocessing.get_context("fork").Pool(clients) as pool:
        latencies = [x for part in pool.map(book_loop, work) for x in part]
    elapsed = time.monotonic() - began
    own = os.times()
    cpu = {kind: used - cpu_before[kind] for kind, used in by_kind(processes,
                                                                    cpu_seconds).items()}
    cpu["clients"] = (own.children_user + own.children_system
                      - own_before.children_user - own_before.children_system)
    booked = max(1, len(latencies))
    return {"rate": len(latencies) / elapsed, "p50": p(latencies, 50), "p99": p(latencies, 99),
            "cpu_ms": {kind: used * 1000 / booked for kind, used in cpu.items()}}


def p(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def reserve_to_active(exports: dict[str, str], count: int, clients: int,
                      within: float = 30.0, calls: list[int] | None = None) -> list[float]:
    """Create (1 GPU, now, one hour), then get every 20 ms until active; release. A client
    that fails (an error answer, or not active `within` seconds) raises here. `calls`, if
    given, gets the number of API calls made appended."""
    url, token = exports["BETTER_COMPUTE_URL"], exports["BETTER_COMPUTE_TOKEN"].strip()
    headers = {"Authorization": f"Bearer {token}"}
    times: list[float] = []
    lock = threading.Lock()
    left = [count]
    made = [0]

    def one(client: httpx.Client) -> None:
        began = time.monotonic()
        rsv = client.post(f"{url}/reservations/create", json={
            "poolId": exports["POOL"], "devices": [{"class": "gpu", "count": 1}],
            "duration": 3_600_000}).json()["result"]
        while True:
            state = client.post(f"{url}/reservations/get",
                                json={"reservationId": rsv["id"]}).json()["result"]["state"]
            made[0] += 1
            if state == "active":
                break
            if time.monotonic() - began > within:
                raise RuntimeError(f"{rsv['id']} not active after {within:.0f} s ({state})")
            time.sleep(0.02)
        with lock:
            times.append(time.monotonic() - began)
        client.post(f"{url}/reservations/release", json={"reservationId": rsv["id"]})

    def loop() -> None:
        with httpx.Client(timeout=30, headers=headers) as client:
            while True:
                with lock:
                    if not left[0]:
                        return
                    left[0] -= 1
                one(client)

    with ThreadPoolExecutor(clients) as pool:
        for client in [pool.submit(loop) for _ in range(clients)]:
            client.result()
    if calls is not None:
        calls.append(made[0] + 2 * count)  # the gets, and each one's create and release
    return times


def raw_ceiling(exports: dict[str, str], clients: int, seconds: float) -> float:
    """The raw-SQL booking loop (bench.booking's) on the stack's own database."""
    first_day = 400 + random.randrange(10_000) * 10_000  # after any earlier run's
    work = f"raw_work({{'pool': {exports['POOL']!r}}}, first_day={first_day})"
    code = ("from bench.common import django_setup, timed_threads; django_setup(); "
            f"from bench.booking import raw_work; print(timed_threads({clients}, {seconds}, "
            f"{work}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, "DATABASE_URL": exports["DATABASE_URL"]})
    return float(done.stdout.strip().splitlines()[-1])


def installed_cli() -> str:
    """The `better-compute` the install wrote beside this interpreter (as a venv's bin has
    it), not one found through PATH: a version manager's shim there is a shell script that
    starts its own processes before Python does."""
    beside = Path(sys.executable).parent / "better-compute"
    return str(beside) if beside.exists() else "better-compute"


def cli_wall(exports: dict[str, str], argv: list[str]) -> float:
    """The median wall time of ten runs of `argv` (the CLI's, unless it starts with the
    interpreter), in ms."""
    env = {**os.environ, **{k: v for k, v in exports.items() if k.startswith("BETTER")}}
    command = argv if argv[0] == sys.executable else [installed_cli(), *argv]
    times = []
    for _ in range(10):
        began = time.monotonic()
        subprocess.run(command, env=env, capture_output=True, check=True)
        times.append(time.monotonic() - began)
    return statistics.median(times) * 1000


def api_alone(clients: str, seconds: float) -> dict[int, tuple[float, float]]:
    """bench.booking's HTTP API alone (`serve` on a database of its own, no agents, gateway
    or workers beside it, kept-alive connections), with its raw-SQL ceiling: clients ->
    (bookings/s, ceiling/s)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.booking", "--clients", clients, "--seconds", str(seconds),
         "--nodes", "8", "--baseline", ""], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parent.parent)
    rates: dict[int, dict[str, float]] = {}
    for line in done.stdout.splitlines():
        found = re.match(r"\s*(\d+) clients\s+(raw SQL|HTTP API)\S*.*?\s([\d,.]+)/s", line)
        if found:
            rates.setdefault(int(found[1]), {})[found[2]] = float(found[3].replace(",", ""))
    return {n: (r["HTTP API"], r["raw SQL"]) for n, r in rates.items()}


def settled(processes: dict[int, str], *, below: float = 0.3, seconds: float = 2.0,
            within: float = 90.0) -> float:
    """Wait until the stack keeps fewer than `below` cores busy for `seconds` (the start's
    own work done: inventories filed, every process warm), at most `within` s; returns the
    seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        before = sum(by_kind(processes, cpu_seconds).values())
        time.sleep(seconds)
        if (sum(by_kind(processes, cpu_seconds).values()) - before) / seconds < below:
            break
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--reservations", type=int, default=60)
    parser.add_argument("--port", type=int, default=3192)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        process, ready, exports = start_dev(Path(folder), args.port, "stack")
        try:
            time.sleep(3)  # the worker starts once the machines are up
            processes = stack_processes(process.pid, data_dir_of(exports["DATABASE_URL"]))
            quiet = settled(processes)
            rss = by_kind(processes, lambda pid: memory_mib(pid, "Rss"))
            pss = by_kind(processes, lambda pid: memory_mib(pid, "Pss"))
            # First, on the fresh stack: after the booking runs the next hours may be full.
            cpu_before, began, calls = by_kind(processes, cpu_seconds), time.monotonic(), []
            active = reserve_to_active(exports, args.reservations, 4, calls=calls)
            polled = time.monotonic() - began
            polling = {kind: used - cpu_before[kind]
                       for kind, used in by_kind(processes, cpu_seconds).items()}
            counts = [int(c) for c in args.clients.split(",")]
            rows = []
            for clients in counts:
                ceiling = raw_ceiling(exports, clients, args.seconds / 2)
                for keep_alive in (False, True):
                    measured = bookings(exports, clients, args.seconds, keep_alive, processes)
                    cpu = measured["cpu_ms"]
                    rows.append({
                        "clients": clients, "connection": "kept" if keep_alive else "new",
                        "per_second": f"{measured['rate']:.1f}",
                        "raw_sql": f"{ceiling:.0f}",
                        "x_raw": f"{measured['rate'] / ceiling:.3f}",
                        "p50_ms": f"{measured['p50'] * 1000:.0f}",
                        "p99_ms": f"{measured['p99'] * 1000:.0f}",
                        "cpu_ms": " ".join(f"{k}={v:.1f}" for k, v in cpu.items() if v >= 0.05),
                    })
                    print(rows[-1], flush=True)
            version = cli_wall(exports, ["--version"])
            whoami = cli_wall(exports, ["api", "system.whoami"])
            interpreter = cli_wall(exports, [sys.executable, "-c", "pass"])
        finally:
            process.terminate()
            process.wait(60)
        process, ready_again, _ = start_dev(Path(folder), args.port, "again")
        process.terminate()
        process.wait(60)
    alone = api_alone(args.clients, args.seconds / 2)
    for row in rows:
        rate, ceiling = alone.get(int(row["clients"]), (float("nan"), float("nan")))
        row["api_alone"] = f"{rate:.1f} ({rate / ceiling:.3f} of its raw {ceiling:.0f})"
        row["x_api_alone"] = f"{float(row['per_second']) / rate:.2f}"
    print()
    print(table(rows))
    print()
    print(table([
        {"measure": "dev --memory --sim 8 ready, first start (migrates)",
         "value": f"{ready:.1f} s"},
        {"measure": "dev --memory --sim 8 ready, again (from the migrated copy)",
         "value": f"{ready_again:.1f} s"},
        {"measure": f"reserve -> active, client side ({len(active)}, 4 clients; after "
                    f"the stack went quiet, {quiet:.0f} s after ready)",
         "value": f"p50 {p(active, 50) * 1000:.0f} ms, p99 {p(active, 99) * 1000:.0f} ms"},
        {"measure": "  while it ran: API calls/s, and cores busy by kind",
         "value": f"{calls[0] / polled:.0f}/s; " + ", ".join(
             f"{k} {v / polled:.2f}" for k, v in polling.items() if v / polled >= 0.01)},
        {"measure": "better-compute --version (median of 10)", "value": f"{version:.0f} ms"},
        {"measure": "  the interpreter alone, `python -c pass` (median of 10)",
         "value": f"{interpreter:.0f} ms"},
        {"measure": "better-compute api system.whoami (median of 10)",
         "value": f"{whoami:.0f} ms"},
        *({"measure": f"{name} of the stack ({len(processes)} processes)",
           "value": f"{sum(memory.values()):.0f} MiB: " + ", ".join(
               f"{k} {v:.0f}" for k, v in memory.items() if v)}
          for name, memory in (("RSS", rss), ("PSS", pss)))]))


if __name__ == "__main__":
    main()
