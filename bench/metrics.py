"""What a Prometheus scrape of `/metrics` costs as the fleet grows.

    python -m bench.metrics [--nodes 100,1000,4000] [--bookings 4] [--scrapes 5]

For each size, a pool of that many H100 x 8 nodes (added to the one before), `--bookings`
reservations per node (a quarter of them held now, the rest later), and one fresh
telemetry sample per GPU; then the series read from the database when `/metrics` is
scraped (compute.http.metrics.DatabaseCollector) are collected `--scrapes` times, and the
exposition text rendered. The baseline is one `SELECT count(*)` over the same GPUs: a scrape
is quoted as a multiple of it, since this machine's speed varies from run to run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import timedelta

from bench.booking import world
from bench.common import bench_environment, table

HOUR = timedelta(hours=1)


def book(pool_id: str, per_node: int, rng: random.Random) -> int:
    """`per_node` reservations on each node without any yet: a quarter held now, the rest
    over the next days; returns how many bookings were written."""
    from django.db import transaction
    from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

    from compute.core.db import database_now
    from compute.platform.tenancy.selectors import root_tenant
    from fleet.models import Device
    from reservations.models import Allocation, Booking, Reservation

    tenant, now = root_tenant(), database_now()
    devices: dict[str, list[str]] = {}
    for node_id, device_id in (Device.objects.filter(node__pool_id=pool_id)
                               .filter(node__allocations__isnull=True)
                               .order_by("node_id", "index").values_list("node_id", "id")):
        devices.setdefault(node_id, []).append(device_id)
    reservations, allocations, bookings = [], [], []
    for node_id, ids in devices.items():
        for n in range(per_node):
            start = now - HOUR if n == 0 else now + (n * 24 + rng.randint(0, 12)) * HOUR
            end = start + rng.randint(2, 12) * HOUR
            chosen = ids[:rng.choice((1, 2, 4, 8))]
            rsv = Reservation(tenant=tenant, pool_id=pool_id, count=len(chosen),
                              state="active" if n == 0 else "placed",
                              duration_ms=int((end - start) / timedelta(milliseconds=1)),
                              during=DateTimeTZRange(start, end, "[)"))
            allocation = Allocation(reservation=rsv, node_id=node_id)
            reservations.append(rsv)
            allocations.append(allocation)
            bookings += [Booking(allocation=allocation, device_id=device,
                                 during=DateTimeTZRange(start, end, "[)")) for device in chosen]
    with transaction.atomic():
        Reservation.objects.bulk_create(reservations, batch_size=2000)
        Allocation.objects.bulk_create(allocations, batch_size=2000)
        Booking.objects.bulk_create(bookings, batch_size=2000)
    return len(bookings)


def sample_every_gpu(pool_id: str) -> None:
    from django.utils import timezone

    from fleet.models import Device, GpuSample

    now = timezone.now()
    GpuSample.objects.bulk_create(
        [GpuSample(device_id=device_id, at=now, utilization=random.randint(0, 100),
                   memory_used_mib=random.randint(0, 80_000))
         for device_id in Device.objects.filter(node__pool_id=pool_id, device_class="gpu")
         .values_list("id", flat=True)], batch_size=5000)


def scrape_seconds(scrapes: int) -> tuple[list[float], int, int]:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from compute.http.metrics import DatabaseCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    seconds, size, samples = [], 0, 0
    for _ in range(scrapes):
        began = time.perf_counter()
        text = generate_latest(registry)
        seconds.append(time.perf_counter() - began)
        size, samples = len(text), text.count(b"\n") - text.count(b"\n#")
    return seconds, size, samples


def per_gpu_seconds(scrapes: int) -> float:
    """The part of a scrape spent on the per-GPU telemetry series."""
    from compute.core.db import database_now
    from fleet.metrics import gpu_telemetry

    seconds = []
    for _ in range(scrapes):
        began = time.perf_counter()
        list(gpu_telemetry(database_now()))
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def baseline_seconds(pool_id: str, scrapes: int) -> float:
    from fleet.models import Device

    seconds = []
    for _ in range(scrapes):
        began = time.perf_counter()
        Device.objects.filter(node__pool_id=pool_id, device_class="gpu").count()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", default="100,1000,4000",
                        help="comma-separated fleet sizes, measured in turn")
    parser.add_argument("--bookings", type=int, default=4, help="reservations per node")
    parser.add_argument("--scrapes", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(46)
    rows = []
    with bench_environment():
        from django.db import connection

        from bench.booking import build_pool, clone_nodes
        from fleet.models import Node

        ids = world()
        pool_id = build_pool(ids, 1)
        template, have = Node.objects.get(pool_id=pool_id), 1
        for size in (int(n) for n in args.nodes.split(",")):
            print(f"growing the pool to {size:,} nodes x 8 GPUs …", flush=True)
            clone_nodes(template, size - have)
            have = size
            booked = book(pool_id, args.bookings, rng)
            sample_every_gpu(pool_id)
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
            seconds, size_bytes, samples = scrape_seconds(args.scrapes)
            base = baseline_seconds(pool_id, args.scrapes)
            per_gpu = per_gpu_seconds(args.scrapes)
            p50 = statistics.median(seconds)
            rows.append({"nodes": f"{size:,}", "GPUs": f"{size * 8:,}",
                         "bookings added": f"{booked:,}", "scrape p50 ms": f"{p50 * 1000:.0f}",
                         "scrape max ms": f"{max(seconds) * 1000:.0f}",
                         "per-GPU series ms": f"{per_gpu * 1000:.0f}",
                         "vs count(*)": f"{p50 / base:.0f}x",
                         "series": f"{samples:,}", "KiB": f"{size_bytes / 1024:.0f}"})
    print(table(rows))


if __name__ == "__main__":
    main()
