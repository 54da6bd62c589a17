"""How fast GPUs are booked, and what one booking costs as the fleet and the ledger grow.

    python -m bench.booking [--seconds 4] [--nodes 100] [--clients 1,8,32] [--baseline REV]
    python -m bench.booking --flat [--sizes 100,1000,10000] [--future 100000]

Throughput (the default): reservations per second at each client count on one pool of
`--nodes` x 8 GPUs, four ways in one run: a raw-SQL booking loop on the same table and
EXCLUDE constraint (the ceiling), the service layer in-process, the HTTP API as `serve` runs
it (with p99 latency, the CPU milliseconds one booking costs in the API's processes and in
Postgres, and how many cores the API, Postgres and the bench's HTTP clients kept busy
together), and the HTTP API of an earlier revision (`--baseline`, default 2c24636: a git
worktree of it runs its own benchmark on a database of the same size). At the end, SQL
counts overlapping bookings of one device (there must be none).

Flat cost (`--flat`): one client, in-process, on pools of each size: per call of
`reservations.create` and `capacity.preview`, p50 and p99; then the smallest pool again with
`--future` bookings spread over the next year, against the same pool empty.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import bench_environment, start_api, table, timed_threads

YEAR_MS = 365 * 24 * 3_600_000


def world() -> dict[str, str]:
    """The root tenant, its admin and token, and a site."""
    from compute.platform.tenancy.selectors import root_tenant
    from compute.platform.tenancy.services import root_bootstrap
    from fleet.services.sites import site_create

    minted = root_bootstrap()
    admin = minted.token.principal
    site = site_create(tenant=root_tenant(), actor=admin, kind="shared", region="bench")
    return {"token": minted.plaintext, "admin": admin.id, "site": site.id}


def build_pool(ids: dict[str, str], nodes: int) -> str:
    """A pool of `nodes` adopted H100 x 8 nodes; its id."""
    from django.db import connection

    from compute.platform.tenancy.models import Principal
    from compute.platform.tenancy.selectors import root_tenant
    from fleet.services.pools import pool_create
    from tests.factories import make_node

    # No host share: the benchmark measures GPU booking, not host counters.
    pool = pool_create(tenant=root_tenant(), actor=Principal.objects.get(pk=ids["admin"]),
                       site_id=ids["site"], pool_class="metal-host", gpu_model="H100",
                       policy={"hostShare": {"vcpusPerGpu": 0, "memoryGiBPerGpu": 0}})
    template = make_node(pool)
    clone_nodes(template, nodes - 1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would on a fleet that grew over time
    return pool.id


def build(nodes: int) -> dict[str, str]:
    ids = world()
    return {**ids, "pool": build_pool(ids, nodes)}


def clone_nodes(template: Any, copies: int) -> None:
    """`copies` adopted nodes shaped like `template` (same devices), written in bulk: a
    fleet of 10,000 joins in seconds instead of an hour."""
    from django.db import transaction

    from bcd.contract.ids import new as new_id
    from fleet.models import Device, Node

    devices = list(Device.objects.filter(node=template))
    template = Node.objects.get(pk=template.pk)
    for first in range(0, copies, 500):
        nodes, atoms = [], []
        for n in range(first, min(copies, first + 500)):
            node = copy.copy(template)
            node.pk, node.hostname = new_id("node"), f"bench-{n:05d}"
            node.serial = node.product_uuid = node.key_pin = ""
            nodes.append(node)
            renamed = {device.id: new_id("dev") for device in devices}
            for device in devices:  # a part (MIG instance, share) follows its GPU's new id
                atoms.append(Device(**{**{f.attname: getattr(device, f.attname)
                                          for f in Device._meta.concrete_fields},
                                       "id": renamed[device.id], "node_id": node.pk,
                                       "parent_id": renamed.get(device.parent_id or ""),
                                       "uuid": f"{device.uuid}-{node.pk}"}))
        with transaction.atomic():
            Node.objects.bulk_create(nodes)
            Device.objects.bulk_create(atoms)


def service_work(ids: dict[str, str]):
    from compute.core.errors import ComputeError
    from compute.platform.tenancy.models import Principal
    from compute.platform.tenancy.selectors import root_tenant
    from reservations.services.book import reservation_create
    from reservations.shape import Shape

    root, admin = root_tenant(), Principal.objects.get(pk=ids["admin"])

    def work(index: int) -> bool:
        try:
            rsv = reservation_create(tenant=root, actor=admin, pool_id=ids["pool"],
                                     shape=Shape(count=1),
                                     duration_ms=60_000,
                                     start_in_ms=random.randrange(60_000, YEAR_MS))
        except ComputeError:
            return False
        return rsv.state == "placed"

    return work


def http_work(ids: dict[str, str], port: int, latencies: list[float]):
    """One kept-open connection per client thread, on the standard library's HTTP client:
    the load generator shares the machine's two cores with the API and Postgres, so it
    should cost as little as it can (httpx took about a millisecond a call)."""
    import http.client
    import json

    local = threading.local()
    headers = {"Authorization": f"Bearer {ids['token']}", "Content-Type": "application/json"}

    def work(index: int) -> bool:
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection("127.0.0.1", port)
        body = json.dumps({"poolId": ids["pool"], "devices": [{"class": "gpu", "count": 1}],
                           "duration": 60_000, "startIn": random.randrange(60_000, YEAR_MS)})
        began = time.perf_counter()
        try:
            local.connection.request("POST", "/api/compute/reservations/create", body, headers)
            response = local.connection.getresponse()
            answer = json.loads(response.read())
        except (OSError, http.client.HTTPException):  # the server closed it: a new one
            local.connection.close()
            del local.connection
            return False
        latencies.append(time.perf_counter() - began)
        return answer.get("ok") and answer["result"]["state"] == "placed"

    return work


def raw_work(ids: dict[str, str], first_day: int = 400):
    """INSERT one booking per transaction, same table and constraint, no placement, from
    `first_day` days ahead (a later run on the same ledger starts after the last)."""
    from django.db import connection

    from compute.platform.tenancy.selectors import root_tenant
    from fleet.models import Device
    from reservations.models import Allocation, Reservation

    rsv = Reservation.objects.create(tenant=root_tenant(), pool_id=ids["pool"], count=1,
                                     duration_ms=60_000)
    device = Device.objects.filter(node__pool_id=ids["pool"]).first()
    allocation = Allocation.objects.create(reservation=rsv, node_id=device.node_id)
    allocation.ended_at = allocation.created_at
    allocation.save(update_fields=["ended_at"])
    devices = list(Device.objects.filter(node__pool_id=ids["pool"]).values_list("id", flat=True))
    counter = itertools.count()

    def work(index: int) -> bool:
        n = next(counter)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO reservations_booking (allocation_id, device_id, during) VALUES "
                "(%s, %s, tstzrange(now() + %s, now() + %s, '[)'))",
                [allocation.id, devices[n % len(devices)],
                 timedelta(days=first_day + n), timedelta(days=first_day + n, minutes=1)])
        return True

    return work


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User and system CPU of these processes and all their children, now, by pid."""
    import psutil

    seconds = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = process.cpu_times()
                    seconds[process.pid] = times.user + times.system
        except psutil.Error:
            continue
    return seconds


def cpu_since(before: dict[int, float], pids: list[int]) -> float:
    """CPU seconds spent since `before` by the processes alive now (a Postgres backend that
    ended in between takes its time with it, rather than counting against the rest)."""
    return sum(now - before.get(pid, 0.0) for pid, now in cpu_seconds(pids).items())


def own_cpu() -> float:
    """This process's CPU seconds (its threads; not its children, the servers)."""
    times = os.times()
    return times.user + times.system


def settle() -> None:
    """Vacuum, analyze and checkpoint what the last mode wrote (thousands of rows a second
    for the raw-SQL loop), so that Postgres' background work for it does not land in the
    next mode's measured window."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("CHECKPOINT")


def postmaster_pid() -> int:
    import psutil
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    return psutil.Process(backend).ppid()


def overlapping_bookings() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM reservations_booking a JOIN reservations_booking b"
                       " ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during")
        return cursor.fetchone()[0]


BASELINE_LINE = re.compile(r"^\s*(\d+) clients\s+HTTP API\s+([\d,.]+)/s")


def baseline_rates(revision: str, args: argparse.Namespace) -> dict[int, float]:
    """Run `revision`'s own benchmark from a git worktree (its own throw-away database, the
    same pool size); its HTTP rate at each client count."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "baseline"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree),
                        revision], check=True, capture_output=True)
        try:
            env = {k: v for k, v in os.environ.items()  # the revision names its own settings
                   if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
            env.update(PYTHONPATH=str(tree), BETTER_COMPUTE_HOME=str(Path(folder) / "home"))
            run = subprocess.run(
                [sys.executable, "-m", "bench.booking", "--seconds", str(args.seconds),
                 "--nodes", str(args.nodes), "--clients", args.clients,
                 "--port", str(args.port + 1)],
                cwd=tree, env=env, capture_output=True, text=True, check=False)
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force",
                            str(tree)], check=False, capture_output=True)
    rates = {int(m[1]): float(m[2].replace(",", ""))
             for m in map(BASELINE_LINE.match, run.stdout.splitlines()) if m}
    if not rates:
        print(f"the baseline {revision} printed no HTTP figures:\n{run.stderr[-2000:]}")
    return rates


def throughput(args: argparse.Namespace) -> None:
    with bench_environment() as (_, children):
        print(f"building {args.nodes} nodes x 8 GPUs …", flush=True)
        ids = build(args.nodes)
        api = start_api(args.port)
        children.append(api)
        postgres = postmaster_pid()
        latencies: list[float] = []
        modes = {"raw SQL (ceiling)": raw_work(ids), "service layer": service_work(ids),
                 "HTTP API": http_work(ids, args.port, latencies)}
        counts = [int(c) for c in args.clients.split(",")]
        # Unmeasured: every API worker process serves requests once (its lazy imports,
        # its connection, its prepared statements), as a server that has been up a while.
        timed_threads(max(counts), 1.0, modes["HTTP API"])
        rows, http = [], {}
        for clients in counts:
            rates = {}
            for name, work in modes.items():
                settle()
                latencies.clear()
                cpu_before = (cpu_seconds([api.pid]), cpu_seconds([postgres]), own_cpu())
                began = time.monotonic()
                rates[name] = timed_threads(clients, args.seconds, work)
                if name == "HTTP API":
                    elapsed = time.monotonic() - began
                    api_s = cpu_since(cpu_before[0], [api.pid])
                    pg_s = cpu_since(cpu_before[1], [postgres])
                    own_s = own_cpu() - cpu_before[2]  # the HTTP clients' threads
                    booked = rates[name] * elapsed
                    http[clients] = (rates[name], p99(latencies) * 1000, api_s * 1000 / booked,
                                     pg_s * 1000 / booked, (api_s + pg_s + own_s) / elapsed)
            ceiling = rates["raw SQL (ceiling)"]
            for name, rate in rates.items():
                rows.append({"clients": clients, "path": name, "per_second": f"{rate:,.1f}",
                             "ratio_to_ceiling": f"{rate / ceiling:.3f}"})
                print(f"  {clients:>2} clients  {name:<18} {rate:9,.1f}/s  "
                      f"{rate / ceiling:.3f} of ceiling", flush=True)
        overlaps = overlapping_bookings()
    print()
    print(table(rows))
    baseline = baseline_rates(args.baseline, args) if args.baseline else {}
    one = http[min(http)][0]
    print(f"\nHTTP API, this tree against {args.baseline or 'no baseline'} (same machine, same"
          " run, same pool size):")
    print(table([{
        "clients": clients, "per_second": f"{rate:,.1f}",
        "baseline": f"{baseline[clients]:,.1f}" if clients in baseline else "-",
        "x_baseline": f"{rate / baseline[clients]:.2f}" if clients in baseline else "-",
        "x_1_client": f"{rate / one:.2f}", "p99_ms": f"{latency:.0f}",
        "cpu_ms_api": f"{api_ms:.1f}", "cpu_ms_postgres": f"{pg_ms:.1f}",
        "cores_busy": f"{cores:.2f}"}
        for clients, (rate, latency, api_ms, pg_ms, cores) in sorted(http.items())]))
    print(f"\noverlapping bookings of one device: {overlaps}")


def future_bookings(pool_id: str, count: int) -> None:
    """`count` one-minute bookings spread over the pool's devices and the next year, held by
    one allocation (never two on a device at once)."""
    from django.db import connection

    from compute.platform.tenancy.selectors import root_tenant
    from fleet.models import Device
    from reservations.models import Allocation, Reservation

    rsv = Reservation.objects.create(tenant=root_tenant(), pool_id=pool_id, count=1,
                                     duration_ms=60_000)
    devices = Device.objects.filter(node__pool_id=pool_id)
    allocation = Allocation.objects.create(reservation=rsv, node_id=devices[0].node_id)
    each = max(1, count // devices.count())
    spacing = YEAR_MS // 60_000 // each  # minutes between one device's bookings
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO reservations_booking (allocation_id, device_id, during) "
            "SELECT %s, d.id, tstzrange(now() + s.at, now() + s.at + interval '1 minute') "
            "FROM (SELECT id FROM fleet_device WHERE node_id IN "
            "      (SELECT id FROM fleet_node WHERE pool_id = %s)) d "
            "CROSS JOIN LATERAL (SELECT interval '1 minute' * (k * %s + "
            "      (hashtext(d.id || k::text) & 1023)) AS at "
            "      FROM generate_series(1, %s) k) s",
            [allocation.id, pool_id, spacing, each])
        cursor.execute("ANALYZE reservations_booking")


def one_client(ids: dict[str, str], pool_id: str, calls: int) -> dict[str, list[float]]:
    """Seconds per `reservations.create` and per `capacity.preview` at one client."""
    from compute.platform.tenancy.models import Principal
    from compute.platform.tenancy.selectors import root_tenant
    from fleet.models import Pool
    from reservations.capacity import capacity_preview
    from reservations.services.book import reservation_create
    from reservations.shape import Ask, Shape

    root, admin = root_tenant(), Principal.objects.get(pk=ids["admin"])
    pool = Pool.objects.get(pk=pool_id)
    timings: dict[str, list[float]] = {"create": [], "preview": []}
    for _ in range(calls):
        start_in = random.randrange(60_000, YEAR_MS)
        began = time.perf_counter()
        capacity_preview(Ask(root.id, pool, Shape(count=1), 60_000), start_in_ms=start_in)
        timings["preview"].append(time.perf_counter() - began)
        began = time.perf_counter()
        reservation_create(tenant=root, actor=admin, pool_id=pool_id, shape=Shape(count=1),
                           duration_ms=60_000, start_in_ms=start_in)
        timings["create"].append(time.perf_counter() - began)
    return timings


def flat(args: argparse.Namespace) -> None:
    sizes = [int(n) for n in args.sizes.split(",")]
    rows = []
    with bench_environment():
        ids = world()
        pools = {}
        for size in sizes:
            print(f"building {size} nodes x 8 GPUs …", flush=True)
            pools[size] = build_pool(ids, size)
        runs = {f"{size} nodes": (pools[size], size) for size in sizes}
        print(f"adding {args.future:,} future bookings to a second {sizes[0]}-node pool …",
              flush=True)
        loaded = build_pool(ids, sizes[0])
        future_bookings(loaded, args.future)
        runs[f"{sizes[0]} nodes + {args.future:,} future bookings"] = (loaded, sizes[0])
        one_client(ids, pools[sizes[0]], 20)  # warm up: connections, caches, plans
        first = None
        for name, (pool_id, _) in runs.items():
            timings = one_client(ids, pool_id, args.calls)
            create = statistics.median(timings["create"]) * 1000
            first = first or create
            rows.append({"ledger": name, "create_p50_ms": f"{create:.1f}",
                         "create_p99_ms": f"{p99(timings['create']) * 1000:.1f}",
                         "preview_p50_ms": f"{statistics.median(timings['preview']) * 1000:.1f}",
                         "preview_p99_ms": f"{p99(timings['preview']) * 1000:.1f}",
                         "x_first": f"{create / first:.2f}"})
            print(f"  {name:<40} create p50 {create:6.1f} ms  x{create / first:.2f}", flush=True)
    print()
    print(table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--port", type=int, default=3181)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--baseline", default="2c24636",
                        help="the revision to compare with ('' for none)")
    parser.add_argument("--flat", action="store_true", help="per-booking cost as things grow")
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--future", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    flat(args) if args.flat else throughput(args)


if __name__ == "__main__":
    main()
