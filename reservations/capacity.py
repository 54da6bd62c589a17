"""Capacity of a pool: the rollup per resource, "would this request fit now", and "when is
the earliest it fits"."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Count, Q, Sum

from compute.core.db import database_now
from compute.core.errors import InvalidArgument
from compute.core.sqltext import fill, tables
from fleet.models import (
    SCHEDULABLE,
    Connectivity,
    Device,
    DeviceClass,
    Health,
    Node,
    NodeRole,
    Pool,
)
from fleet.models import ProvisionState as PS
from reservations.candidates import (
    IN_THE_WAY,
    MAX_START_AHEAD,
    device_filter_q,
    end_by,
    later_start,
    pending_reason,
    placement_request,
    propose,
    schedulable_sql,
    window,
)
from reservations.earliest import search_for
from reservations.gangplace import GangChoice
from reservations.models import Booking, Reservation
from reservations.placement import Choice
from reservations.services.gang import (
    earliest_gang,
    gang_never_fits,
    gang_no_slot,
    propose_gang,
)
from reservations.shape import Ask

GPU_STATES = ("total", "allocatable", "allocated", "reserved", "available", "provisioning",
              "unhealthy", "maintenance", "unreachable")


def gpu_counts(now: datetime, pool_ids: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Per pool (all, or those of `pool_ids`): how many whole GPUs are in each of
    GPU_STATES now (see capacity_rollup); one query."""
    instant = DateTimeTZRange(now, now, "[]")
    # A GPU is held when it, or any of its parts (MIG instances, shares), is booked. Each set
    # is read once (a hashed subplan), not probed per GPU: linear in bookings plus GPUs.
    # (no NULL in these sets: NOT IN over a set holding one is never true)
    held = Booking.objects.filter(during__overlap=instant, allocation__isnull=False,
                                  gpu__isnull=False).values("gpu_id")
    later = Booking.objects.filter(during__startswith__gt=now, allocation__isnull=False,
                                   gpu__isnull=False).values("gpu_id")
    serviced = Booking.objects.filter(during__overlap=instant, maintenance__isnull=False
                                      ).values("device_id")
    gpus = Device.objects.filter(node__role=NodeRole.NODE, node__pool__isnull=False,
                                 present=True, device_class=DeviceClass.GPU)
    if pool_ids is not None:
        gpus = gpus.filter(node__pool_id__in=pool_ids)
    is_held, is_serviced = Q(pk__in=held), Q(pk__in=serviced)
    schedulable = Q(node__in=Node.objects.filter(SCHEDULABLE)) & Q(
        health=Health.HEALTHY) & ~is_serviced
    rows = gpus.values("node__pool_id").annotate(
        total=Count("pk"),
        allocatable=Count("pk", filter=schedulable),
        allocated=Count("pk", filter=is_held),
        reserved=Count("pk", filter=Q(pk__in=later)),
        available=Count("pk", filter=schedulable & ~is_held),
        provisioning=Count("pk", filter=~Q(node__provision_state=PS.ADOPTED)),
        unhealthy=Count("pk", filter=Q(health=Health.UNHEALTHY) | Q(
            node__health=Health.UNHEALTHY)),
        maintenance=Count("pk", filter=Q(node__cordoned=True) | is_serviced),
        unreachable=Count("pk", filter=Q(node__connectivity=Connectivity.UNREACHABLE)),
    ).order_by()
    found: dict[str, dict[str, int]] = {}
    for row in rows:
        counts: dict[str, Any] = dict(row)
        found[counts.pop("node__pool_id")] = counts
    return found


def capacity_rollup(pool: Pool) -> dict[str, Any]:
    """Per resource: total, allocatable, allocated (held now), reserved (with a booking that
    starts later) and available now; plus GPUs provisioning, unhealthy, in maintenance or
    unreachable. Allocatable means on a node the placer considers. In maintenance: on a
    cordoned node, or inside a maintenance window now."""
    now = database_now()
    instant = DateTimeTZRange(now, now, "[]")
    counts = gpu_counts(now, pool_ids=[pool.id]).get(pool.id) or dict.fromkeys(GPU_STATES, 0)
    nodes = Node.objects.filter(pool=pool, role=NodeRole.NODE)  # not its provisioners
    host = nodes.aggregate(vcpus=Sum("vcpus"), vcpus_allocated=Sum("vcpus_allocated"),
                           memory=Sum("memory_gib"), memory_allocated=Sum("memory_gib_allocated"))
    live = nodes.filter(SCHEDULABLE).aggregate(
        vcpus=Sum("vcpus"), vcpus_allocated=Sum("vcpus_allocated"), memory=Sum("memory_gib"),
        memory_allocated=Sum("memory_gib_allocated"))

    def host_row(total: str, allocated: str) -> dict[str, int]:
        allocatable = live[total] or 0
        return {"total": host[total] or 0, "allocatable": allocatable,
                "allocated": host[allocated] or 0,
                "available": allocatable - (live[allocated] or 0)}

    return {
        "poolId": pool.id, "gpuModel": pool.gpu_model or None, "at": now,
        "nodes": nodes.count(),
        "gpu": {k: counts[k] for k in ("total", "allocatable", "allocated", "reserved",
                                       "available")},
        "gpusNotSchedulable": {k: counts[k] for k in ("provisioning", "unhealthy",
                                                      "maintenance", "unreachable")},
        "vcpu": host_row("vcpus", "vcpus_allocated"),
        "memoryGiB": host_row("memory", "memory_allocated"),
        "parts": parts_rollup(pool, instant),
        "pending": Reservation.objects.filter(pool=pool, state="pending").count(),
    }


# MIG instances and shares per class and profile: how many, and how many a request could
# take now (on a schedulable node, healthy, and neither they nor their GPU booked now).
PARTS_SQL = tables("""
SELECT d.device_class, d.profile, count(*),
       count(*) FILTER (WHERE {schedulable} AND d.health = 'healthy' AND NOT EXISTS (
           SELECT 1 FROM {Booking} b WHERE {in_the_way}))
  FROM {Device} d JOIN {Node} ON {Node}.id = d.node_id
 WHERE {Node}.pool_id = %(pool)s AND d.present AND d.device_class <> 'gpu'
 GROUP BY 1, 2 ORDER BY 1, 2""", Booking=Booking, Device=Device, Node=Node)


def parts_rollup(pool: Pool, instant: DateTimeTZRange) -> list[dict[str, Any]]:
    sql = fill(PARTS_SQL, schedulable=schedulable_sql(),
               in_the_way=fill(IN_THE_WAY, device="d", during="%(now)s"))
    with connection.cursor() as cursor:
        cursor.execute(sql, {"pool": pool.id, "now": instant})
        rows = cursor.fetchall()
    # A share's profile is its slot (2/4): shares are counted together.
    found: dict[tuple[str, str | None], list[int]] = {}
    for kind, profile, total, available in rows:
        key = (kind, profile if kind == DeviceClass.MIG else None)
        counts = found.setdefault(key, [0, 0])
        counts[0] += total
        counts[1] += available
    return [{"class": kind, "profile": profile, "total": total, "available": available}
            for (kind, profile), (total, available) in found.items()]


def capacity_preview(ask: Ask, *, start: datetime | None = None,
                     start_in_ms: int | None = None) -> dict[str, Any]:
    """Would `ask` fit now, or from `start` (or `start_in_ms` after now)? Books
    nothing and takes no locks."""
    now = database_now()
    if start_in_ms is not None:
        start = now + timedelta(milliseconds=start_in_ms)
    if start is not None and start > now + MAX_START_AHEAD:
        raise InvalidArgument(f"start: at most {MAX_START_AHEAD.days} days ahead",
                              field="start")
    pool, count = ask.pool, ask.shape.count
    during = window(max(start or now, now), ask.duration_ms)
    request = placement_request(pool, ask.shape)
    devices = device_filter_q(ask.shape)
    choice, candidates = propose(pool, during, request, device_filter=devices)
    if choice is None:
        return {"fits": False, "poolId": pool.id, "gpus": count,
                "window": {"start": during.lower, "end": during.upper},
                "reason": pending_reason(pool, during, candidates, request, devices)}
    return {"fits": True, **placed_view(pool, count, choice, during)}


def gang_preview(ask: Ask, nodes: int, *, start: datetime | None = None,
                 start_in_ms: int | None = None) -> dict[str, Any]:
    """Would a gang of `nodes` nodes, each with `ask`'s shape, fit now (or from a start),
    on which nodes and how close together? Books nothing and takes no locks."""
    now = database_now()
    start = now + timedelta(milliseconds=start_in_ms) if start_in_ms is not None else start
    pool, count = ask.pool, ask.shape.count
    during = window(max(start or now, now), ask.duration_ms)
    choice, fitting = propose_gang(pool, during, ask.shape, nodes)
    if choice is None:
        reason = gang_never_fits(pool, ask.shape, nodes) or (
            f"{len(fitting)} of the {nodes} nodes it needs have {count} free GPUs in the "
            "window")
        return {"fits": False, "poolId": pool.id, "gpus": count, "nodes": nodes,
                "window": {"start": during.lower, "end": during.upper}, "reason": reason}
    return {"fits": True, **gang_view(pool, count, choice, during)}


def gang_earliest(ask: Ask, nodes: int, *, after: datetime | None = None,
                  after_in_ms: int | None = None, before: datetime | None = None,
                  before_in_ms: int | None = None) -> dict[str, Any]:
    """The earliest window in which a gang of `nodes` nodes with `ask`'s shape each fits,
    on which nodes; or why none. Books nothing and takes no locks."""
    now = database_now()
    slot, search = earliest_gang(ask, nodes, now, later_start(now, after, after_in_ms,
                                                              field="after"),
                                 end_by(now, before, before_in_ms))
    if slot is None:
        return {"found": False, "poolId": ask.pool.id, "gpus": ask.shape.count,
                "nodes": nodes, "reason": gang_no_slot(ask, nodes, search)}
    return {"found": True, **gang_view(ask.pool, ask.shape.count, slot.choice, slot.during)}


def gang_view(pool: Pool, gpus: int, choice: GangChoice, during: DateTimeTZRange
              ) -> dict[str, Any]:
    """Where a gang would go: its nodes and their devices, how close together, its window."""
    return {"poolId": pool.id, "gpus": gpus, "nodes": len(choice.members),
            "racks": list(choice.racks), "rails": list(choice.rails),
            "placement": choice.summary(),
            "members": [{"nodeId": member.node_id,
                         "devices": list(Device.objects.filter(pk__in=member.device_ids)
                                         .order_by("index").values_list("uuid", flat=True))}
                        for member in choice.members],
            "window": {"start": during.lower, "end": during.upper}}


def placed_view(pool: Pool, gpus: int, choice: Choice, during: DateTimeTZRange
                ) -> dict[str, Any]:
    """Where a request would go: node, devices, NVLink domains, host share and window."""
    devices = Device.objects.filter(pk__in=choice.device_ids).order_by("index")
    return {"poolId": pool.id, "gpus": gpus, "nodeId": choice.node_id,
            "nodeClass": pool.pool_class, "devices": [d.uuid for d in devices],
            "nvlinkDomains": sorted({d.nvlink_domain for d in devices if d.nvlink_domain}),
            "vcpus": choice.vcpus, "memoryGiB": choice.memory_gib,
            "window": {"start": during.lower, "end": during.upper}}


def capacity_earliest(ask: Ask, *, after: datetime | None = None,
                      after_in_ms: int | None = None, before: datetime | None = None,
                      before_in_ms: int | None = None) -> dict[str, Any]:
    """The earliest window in which `ask` fits on one node, starting no sooner
    than `after` (default now) and ending no later than `before` (default: starting within
    the start horizon), and where. Books nothing and takes no locks."""
    now = database_now()
    search = search_for(ask, now, later_start(now, after, after_in_ms, field="after"),
                        end_by(now, before, before_in_ms))
    slot = search.slot()
    if slot is None:
        return {"found": False, "poolId": ask.pool.id, "gpus": ask.shape.count,
                "reason": search.reason()}
    return {"found": True, **placed_view(ask.pool, ask.shape.count, slot.choice, slot.during)}
