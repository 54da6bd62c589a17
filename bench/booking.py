"""Reservations created per second on 100 nodes x 8 GPUs, at 1, 8 and 32 clients.

Three ways in one run, on one database: through the service layer, through HTTP (the real
API under daphne), and a raw-SQL booking loop on the same table and EXCLUDE constraint,
which is the ceiling; each is printed with its ratio to the ceiling at that concurrency.

    python -m bench.booking [--seconds 4] [--nodes 100]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import random
import threading
from datetime import timedelta
from typing import Any

from bench.common import bench_environment, start_api, table, timed_threads

YEAR_MS = 365 * 24 * 3_600_000


def build(nodes: int) -> dict[str, str]:
    from compute.tenancy.selectors import root_tenant
    from compute.tenancy.services import root_bootstrap
    from fleet.services.pools import pool_create
    from fleet.services.sites import site_create
    from django.db import connection

    from tests.factories import make_node

    minted = root_bootstrap()
    admin, root = minted.token.principal, root_tenant()
    site = site_create(tenant=root, actor=admin, kind="shared", region="bench")
    # No host share: the benchmark measures GPU booking, not host counters.
    pool = pool_create(tenant=root, actor=admin, site_id=site.id, pool_class="metal-host",
                       gpu_model="H100",
                       policy={"hostShare": {"vcpusPerGpu": 0, "memoryGiBPerGpu": 0}})
    template = make_node(pool)
    clone_nodes(template, nodes - 1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would on a fleet that grew over time
    return {"pool": pool.id, "token": minted.plaintext, "admin": admin.id}


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
            for device in devices:
                atoms.append(Device(**{**{f.attname: getattr(device, f.attname)
                                          for f in Device._meta.concrete_fields},
                                       "id": new_id("dev"), "node_id": node.pk,
                                       "uuid": f"GPU-{node.pk}-{device.index}"}))
        with transaction.atomic():
            Node.objects.bulk_create(nodes)
            Device.objects.bulk_create(atoms)


def service_work(ids: dict[str, str]):
    from compute.errors import ComputeError
    from compute.tenancy.models import Principal
    from compute.tenancy.selectors import root_tenant
    from reservations.services.book import reservation_create

    root, admin = root_tenant(), Principal.objects.get(pk=ids["admin"])

    def work(index: int) -> bool:
        try:
            rsv = reservation_create(tenant=root, actor=admin, pool_id=ids["pool"], gpus=1,
                                     duration_ms=60_000,
                                     start_in_ms=random.randrange(60_000, YEAR_MS))
        except ComputeError:
            return False
        return rsv.state == "placed"

    return work


def http_work(ids: dict[str, str], port: int):
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    local = threading.local()

    def work(index: int) -> bool:
        if not hasattr(local, "client"):
            local.client = httpx.Client(headers={"Authorization": f"Bearer {ids['token']}"})
        response = local.client.post(
            f"http://127.0.0.1:{port}/api/compute/reservations/create",
            json={"poolId": ids["pool"], "devices": [{"class": "gpu", "count": 1}],
                  "duration": 60_000, "startIn": random.randrange(60_000, YEAR_MS)})
        body = response.json()
        return body.get("ok") and body["result"]["state"] == "placed"

    return work


def raw_work(ids: dict[str, str]):
    """INSERT one booking per transaction, same table and constraint, no placement."""
    from django.db import connection

    from compute.tenancy.selectors import root_tenant
    from fleet.models import Device
    from reservations.models import Allocation, Reservation

    rsv = Reservation.objects.create(tenant=root_tenant(), pool_id=ids["pool"], gpu_count=1,
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
                 timedelta(days=400 + n), timedelta(days=400 + n, minutes=1)])
        return True

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--port", type=int, default=3181)
    parser.add_argument("--clients", default="1,8,32")
    args = parser.parse_args()
    with bench_environment() as (_, children):
        print(f"building {args.nodes} nodes x 8 GPUs …", flush=True)
        ids = build(args.nodes)
        children.append(start_api(args.port))
        modes = {"raw SQL (ceiling)": raw_work(ids), "service layer": service_work(ids),
                 "HTTP API": http_work(ids, args.port)}
        rows = []
        for clients in (int(c) for c in args.clients.split(",")):
            rates = {name: timed_threads(clients, args.seconds, work)
                     for name, work in modes.items()}
            ceiling = rates["raw SQL (ceiling)"]
            for name, rate in rates.items():
                rows.append({"clients": clients, "path": name, "per_second": f"{rate:,.1f}",
                             "ratio_to_ceiling": f"{rate / ceiling:.3f}"})
                print(f"  {clients:>2} clients  {name:<18} {rate:9,.1f}/s  "
                      f"{rate / ceiling:.3f} of ceiling", flush=True)
        print()
        print(table(rows))


if __name__ == "__main__":
    main()
