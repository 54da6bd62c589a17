"""Reads the placer works on: schedulable nodes of a pool and their devices free in a window."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Exists, OuterRef

from fleet.models import SCHEDULABLE, Device, DeviceClass, Health, Node, Pool
from reservations.device_filter import parse_selector
from reservations.ledger import Booking, Reservation
from reservations.placement import Candidate, FreeDevice, Request


def window(start: datetime, duration_ms: int) -> DateTimeTZRange:
    return DateTimeTZRange(start, start + timedelta(milliseconds=duration_ms), "[)")


def host_share(pool: Pool, node_vcpus: int, node_memory: int, node_gpus: int) -> tuple[int, int]:
    """vCPUs and GiB a booking takes per GPU: the pool's policy, else an even split."""
    share = pool.host_share
    gpus = max(1, node_gpus)
    return (int(share.get("vcpusPerGpu", node_vcpus // gpus)),
            int(share.get("memoryGiBPerGpu", node_memory // gpus)))


def load_candidates(pool: Pool, during: DateTimeTZRange,
                    excluded: Collection[str] = ()) -> list[Candidate]:
    nodes = list(Node.objects.filter(pool=pool).filter(SCHEDULABLE).exclude(pk__in=excluded)
                 .values("id", "vcpus", "memory_gib", "vcpus_allocated",
                         "memory_gib_allocated"))
    if not nodes:
        return []
    busy = Booking.objects.filter(device=OuterRef("pk"), during__overlap=during)
    devices = (Device.objects
               .filter(node_id__in=[n["id"] for n in nodes], present=True,
                       device_class=DeviceClass.GPU)
               .annotate(busy=Exists(busy))
               .values("id", "uuid", "index", "product", "model", "vram_gib", "nvlink_domain",
                       "health", "busy", "node_id"))
    free: dict[str, list[FreeDevice]] = {n["id"]: [] for n in nodes}
    gpus: Counter[str] = Counter()
    domains: dict[str, Counter[str]] = {n["id"]: Counter() for n in nodes}
    for d in devices:
        gpus[d["node_id"]] += 1
        if d["nvlink_domain"]:
            domains[d["node_id"]][d["nvlink_domain"]] += 1
        if not d["busy"] and d["health"] == Health.HEALTHY:
            free[d["node_id"]].append(FreeDevice(
                id=d["id"], uuid=d["uuid"], index=d["index"], product=d["product"],
                model=d["model"], vram_gib=d["vram_gib"], nvlink_domain=d["nvlink_domain"]))
    candidates = []
    for n in nodes:
        vcpus_per_gpu, memory_per_gpu = host_share(pool, n["vcpus"], n["memory_gib"],
                                                   gpus[n["id"]])
        candidates.append(Candidate(
            node_id=n["id"], free=free[n["id"]], domain_sizes=dict(domains[n["id"]]),
            vcpus_free=n["vcpus"] - n["vcpus_allocated"],
            memory_gib_free=n["memory_gib"] - n["memory_gib_allocated"],
            vcpus_per_gpu=vcpus_per_gpu, memory_gib_per_gpu=memory_per_gpu))
    return candidates


def placement_request(rsv: Reservation) -> Request:
    """What the placer should look for: the count, the topology, product and selector."""
    device_filter = parse_selector(rsv.selector)
    product = rsv.product

    def matches(device: Any) -> bool:
        return (not product or device.product == product) and device_filter(device)

    return Request(count=rsv.gpu_count, topology=rsv.topology, device_filter=matches)
