"""How long "when is the earliest I can have this?" takes on a busy calendar.

    python -m bench.earliest [--nodes 1000] [--bookings 20] [--calls 300]

A pool of `--nodes` H100 x 8 nodes (two NVLink domains of 4), each with `--bookings` future
bookings of 1, 2, 4 or 8 GPUs and 1 to 12 hours over the next two weeks, laid out per device
so none overlap. One client asks `capacity.earliest` in-process for mixed requests (1 to 8
GPUs, some NVLink-bound, 1 to 8 hours, from now up to 5 days ahead) and prints p50/p99,
against `capacity.preview` for the same requests on the same pool (the baseline: "does it fit
at this one time?"). Then `reservations.create --at-earliest` books some of them, and the
free time those bookings marked is recomputed as the workers would.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import timedelta
from typing import Any

from bench.booking import build_pool, p99, world
from bench.common import bench_environment, table

HOUR = timedelta(hours=1)
SHAPES = [(1, "any"), (2, "any"), (2, "nvlink-all"), (4, "nvlink-all"), (4, "any"),
          (8, "any")]


def busy_calendar(pool_id: str, per_node: int, rng: random.Random) -> int:
    """`per_node` placed reservations on every node of the pool, each on 1, 2, 4 or 8 of its
    GPUs (aligned to NVLink domains) for 1-12 hours, one after another per device with
    gaps; returns how many bookings were written."""
    from django.db import transaction
    from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

    from compute.core.db import database_now
    from compute.platform.tenancy.selectors import root_tenant
    from fleet.models import Device
    from reservations.models import Allocation, Booking, Reservation

    tenant, now = root_tenant(), database_now()
    devices: dict[str, list[str]] = {}
    for node_id, device_id in (Device.objects.filter(node__pool_id=pool_id)
                               .order_by("node_id", "index").values_list("node_id", "id")):
        devices.setdefault(node_id, []).append(device_id)
    written = 0
    for chunk_start in range(0, len(devices), 100):
        reservations, allocations, bookings = [], [], []
        for node_id in list(devices)[chunk_start:chunk_start + 100]:
            ids = devices[node_id]
            free_from = [now + rng.uniform(0, 12) * HOUR for _ in ids]
            for _ in range(per_node):
                size = rng.choice((1, 2, 4, 8))
                first = rng.randrange(0, len(ids), size)
                chosen = range(first, first + size)
                start = max(free_from[i] for i in chosen) + rng.uniform(0, 6) * HOUR
                end = start + rng.randint(1, 12) * HOUR
                rsv = Reservation(tenant=tenant, pool_id=pool_id, count=size, state="placed",
                                  duration_ms=int((end - start) / timedelta(milliseconds=1)),
                                  during=DateTimeTZRange(start, end, "[)"))
                allocation = Allocation(reservation=rsv, node_id=node_id)
                reservations.append(rsv)
                allocations.append(allocation)
                for i in chosen:
                    free_from[i] = end
                    bookings.append(Booking(allocation=allocation, device_id=ids[i],
                                            during=DateTimeTZRange(start, end, "[)")))
        with transaction.atomic():
            Reservation.objects.bulk_create(reservations)
            Allocation.objects.bulk_create(allocations)
            Booking.objects.bulk_create(bookings)
        written += len(bookings)
    from django.db import connection

    from reservations.gaps import gaps_mend

    began = time.perf_counter()
    gaps_mend()  # as the workers do after bookings: the free time of whole groups
    print(f"free time of {len(devices):,} nodes recomputed in "
          f"{time.perf_counter() - began:.1f} s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return written


def requests(count: int, rng: random.Random) -> list[dict[str, Any]]:
    asks = []
    for _ in range(count):
        gpus, topology = rng.choice(SHAPES)
        asks.append({"gpus": gpus, "topology": topology,
                     "duration_ms": rng.choice((1, 2, 4, 8)) * 3_600_000,
                     "after_in_ms": rng.randrange(0, 5 * 24) * 3_600_000})
    return asks


def timed(asks: list[dict[str, Any]], pool_id: str, ask) -> tuple[list[float], int]:
    from fleet.models import Pool
    from reservations.shape import Ask, Shape

    pool = Pool.objects.get(pk=pool_id)
    seconds, answered = [], 0
    for shape in asks:
        unsaved = Ask(pool.tenant_id, pool, Shape(count=shape["gpus"], topology=shape["topology"]),
                      shape["duration_ms"])
        began = time.perf_counter()
        answered += bool(ask(pool, unsaved, shape["after_in_ms"]))
        seconds.append(time.perf_counter() - began)
    return seconds, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--bookings", type=int, default=20, help="future bookings per node")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with bench_environment():
        from compute.platform.tenancy.models import Principal
        from compute.platform.tenancy.selectors import root_tenant
        from reservations.capacity import capacity_earliest, capacity_preview
        from reservations.gaps import gaps_mend
        from reservations.services.book import reservation_create
        from reservations.shape import Shape

        ids = world()
        print(f"building {args.nodes} nodes x 8 GPUs …", flush=True)
        pool_id = build_pool(ids, args.nodes)
        print(f"writing {args.bookings} future reservations per node …", flush=True)
        written = busy_calendar(pool_id, args.bookings, rng)
        print(f"{written:,} bookings over {args.nodes * args.bookings:,} reservations")
        asks = requests(args.calls, rng)

        def earliest(pool: Any, unsaved: Any, after_in_ms: int) -> bool:
            return capacity_earliest(unsaved, after_in_ms=after_in_ms)["found"]

        def preview(pool: Any, unsaved: Any, after_in_ms: int) -> bool:
            return capacity_preview(unsaved, start_in_ms=after_in_ms)["fits"]

        timed(asks[:20], pool_id, earliest)  # warm up: connections, caches, plans
        timed(asks[:20], pool_id, preview)
        rows = []
        first: tuple[float, float] | None = None
        for name, ask in (("capacity.preview (baseline)", preview),
                          ("capacity.earliest", earliest)):
            seconds, answered = timed(asks, pool_id, ask)
            p50, tail = statistics.median(seconds) * 1000, p99(seconds) * 1000
            first = first or (p50, tail)
            rows.append({"call": name, "p50_ms": f"{p50:.1f}", "p99_ms": f"{tail:.1f}",
                         "x_baseline_p50": f"{p50 / first[0]:.2f}",
                         "x_baseline_p99": f"{tail / first[1]:.2f}",
                         "answered_yes": f"{answered}/{len(asks)}"})
        found_first = first[0]
        admin = Principal.objects.get(pk=ids["admin"])
        booked = []
        for shape in asks[:50]:
            began = time.perf_counter()
            reservation_create(tenant=root_tenant(), actor=admin, pool_id=pool_id,
                               shape=Shape(count=shape["gpus"], topology=shape["topology"]),
                               duration_ms=shape["duration_ms"],
                               start_in_ms=shape["after_in_ms"], at_earliest=True)
            booked.append(time.perf_counter() - began)
        p50 = statistics.median(booked) * 1000
        rows.append({"call": "reservations.create atEarliest", "p50_ms": f"{p50:.1f}",
                     "p99_ms": f"{p99(booked) * 1000:.1f}",
                     "x_baseline_p50": f"{p50 / found_first:.2f}", "x_baseline_p99": "",
                     "answered_yes": f"{len(booked)}/50"})
        began = time.perf_counter()
        gaps_mend()  # what the workers do after those 50 bookings
        mended = (time.perf_counter() - began) * 1000
        rows.append({"call": "gaps mended after them (workers)", "p50_ms": f"{mended / 50:.1f}",
                     "p99_ms": "", "x_baseline_p50": f"{mended / 50 / found_first:.2f}",
                     "x_baseline_p99": "", "answered_yes": "per booking"})
    print(f"\n{args.nodes} nodes x 8 GPUs, {args.bookings} future reservations per node, "
          f"one client, in-process:")
    print(table(rows))


if __name__ == "__main__":
    main()
