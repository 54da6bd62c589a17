"""Reads the placer works on: schedulable nodes of a pool and their devices free in a window.

The grouping happens in SQL, one row per (node, NVLink domain) with the free device ids in
index order, so a pool of hundreds of nodes costs one small result set per placement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta

from django.contrib.postgres.aggregates import StringAgg
from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Count, Exists, OuterRef, Q

from fleet.models import SCHEDULABLE, Device, DeviceClass, Health, Node, Pool
from reservations.device_filter import parse_selector
from reservations.ledger import Booking, Reservation
from reservations.placement import BUSY, Candidate, Group, Request, why_not

MAX_START_AHEAD = timedelta(days=366)  # the latest start a request may ask for


def window(start: datetime, duration_ms: int) -> DateTimeTZRange:
    return DateTimeTZRange(start, start + timedelta(milliseconds=duration_ms), "[)")


def host_share(pool: Pool, node_vcpus: int, node_memory: int, node_gpus: int) -> tuple[int, int]:
    """vCPUs and GiB a booking takes per GPU: the pool's policy, else an even split."""
    share = pool.host_share
    gpus = max(1, node_gpus)
    return (int(share.get("vcpusPerGpu", node_vcpus // gpus)),
            int(share.get("memoryGiBPerGpu", node_memory // gpus)))


def device_filter_q(rsv: Reservation) -> Q:
    """The reservation's product and selector as a filter over devices (validated names,
    parameterised values: nothing from the request reaches SQL as text)."""
    q = parse_selector(rsv.selector).to_q()
    return q & Q(product=rsv.product) if rsv.product else q


def placement_request(rsv: Reservation) -> Request:
    return Request(count=rsv.gpu_count, topology=rsv.topology)


def load_candidates(pool: Pool, during: DateTimeTZRange, *, device_filter: Q | None = None,
                    excluded: Collection[str] = ()) -> list[Candidate]:
    """One query: a row per (schedulable node, NVLink domain) with its free device ids."""
    busy = Booking.objects.filter(device=OuterRef("pk"), during__overlap=during)
    usable = Q(busy=False, health=Health.HEALTHY) & (device_filter or Q())
    nodes = Node.objects.filter(pool=pool).filter(SCHEDULABLE).exclude(pk__in=excluded)
    rows = (Device.objects
            .filter(node__in=nodes, present=True, device_class=DeviceClass.GPU)
            .annotate(busy=Exists(busy))
            .values("node_id", "node__vcpus", "node__memory_gib", "node__vcpus_allocated",
                    "node__memory_gib_allocated", "nvlink_domain")
            # A joined string parses much faster than a text[] of hundreds of ids.
            .annotate(size=Count("pk"), free=StringAgg("id", ",", filter=usable,
                                                       order_by="index", default=""))
            .order_by()
            .values_list("node_id", "node__vcpus", "node__memory_gib", "node__vcpus_allocated",
                         "node__memory_gib_allocated", "nvlink_domain", "size", "free"))
    groups: dict[str, list[Group]] = defaultdict(list)
    gpus: dict[str, int] = defaultdict(int)
    host: dict[str, tuple[int, int, int, int]] = {}
    for node_id, vcpus, memory, vcpus_used, memory_used, domain, size, joined in rows:
        free = joined.split(",") if joined else []
        host[node_id] = (vcpus, memory, vcpus_used, memory_used)
        gpus[node_id] += size
        if domain:
            groups[node_id].append(Group(domain, size, tuple(free)))
        else:  # no NVLink: every device is a group of one
            groups[node_id].extend(Group("", 1, (device_id,)) for device_id in free)
    candidates = []
    for node_id, (vcpus, memory, vcpus_used, memory_used) in sorted(host.items()):
        vcpus_per_gpu, memory_per_gpu = host_share(pool, vcpus, memory, gpus[node_id])
        candidates.append(Candidate(
            node_id=node_id, groups=tuple(groups[node_id]), vcpus_free=vcpus - vcpus_used,
            memory_gib_free=memory - memory_used, vcpus_per_gpu=vcpus_per_gpu,
            memory_gib_per_gpu=memory_per_gpu))
    return candidates


def pending_reason(pool: Pool, during: DateTimeTZRange, candidates: Sequence[Candidate],
                   request: Request) -> str:
    """Why a request fits nowhere in `during`: no node that could ever hold it, or, when
    some could, until when the bookings in the way last."""
    reason = why_not(candidates, request)
    if reason != BUSY:
        return reason
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(upper(b.during)) FROM reservations_booking b "
            "JOIN fleet_device d ON d.id = b.device_id JOIN fleet_node n ON n.id = d.node_id "
            "WHERE n.pool_id = %s AND b.during && %s", [pool.id, during])
        row = cursor.fetchone()
    until: datetime | None = row[0] if row else None
    if until is None:
        return "every node that could hold it lacks the free host share (vCPUs, memory)"
    return (f"all fitting nodes are busy; the first booking in the way ends at "
            f"{until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}")
