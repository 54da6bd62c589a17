"""Sharing a pool: priority classes, fair share, and the order of the pending queue.

A pool's priority classes are `high` (weight 100), `normal` (50, the default) and
`preemptible` (0), plus those its policy adds or reweighs (`sharing.priorityClasses`). The
owner may ask for any class; another tenant for those its offering grants (by default
`normal` and `preemptible`).

Fair share, as Slurm's classic multifactor priority: each tenant of the pool has a share
weight (the offering's `share`; the owner's is `sharing.ownerShare`), and a usage: the
GPU-hours its reservations held on the pool, each hour counted at 2^(-age / half-life)
(`sharing.fairShareHalfLifeHours`, 24 by default), MIG instances and shares in their
fraction of a GPU. With U its part of the pool's decayed usage and S its part of the
shares, its factor is 2^(-U/S): 1 for a tenant that used nothing, 0.5 for one that used
exactly its share, less for one over it.

Pending requests are placed in order of priority, then fair-share factor, then age.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import Q

from compute.core.errors import InvalidArgument
from compute.core.sqltext import tables
from fleet.models import Pool
from reservations.models import Offering, Reservation, ReservationState

DEFAULT_CLASS = "normal"
HALF_LIFE_HOURS = 24.0
NOTICE_SECONDS = 120.0  # a preempted reservation's notice
MIG_SLICES = 7  # a MIG instance's profile names its slices of seven (3g.40gb: 3/7)
DEFAULT_SHARES_PER_GPU = 1


@dataclass(frozen=True)
class PriorityClass:
    name: str
    weight: int
    preemptible: bool = False


BUILT_IN = {"high": PriorityClass("high", 100), "normal": PriorityClass("normal", 50),
            "preemptible": PriorityClass("preemptible", 0, preemptible=True)}


def sharing_policy(pool: Pool) -> dict[str, Any]:
    policy = pool.policy.get("sharing") if isinstance(pool.policy, dict) else None
    return policy if isinstance(policy, dict) else {}


def pool_classes(pool: Pool) -> dict[str, PriorityClass]:
    """The pool's priority classes by name."""
    classes = dict(BUILT_IN)
    for spec in sharing_policy(pool).get("priorityClasses", []):
        classes[spec["name"]] = PriorityClass(spec["name"], int(spec["weight"]),
                                              bool(spec.get("preemptible", False)))
    return classes


def granted_classes(tenant_id: str, pool: Pool) -> list[str]:
    """The classes `tenant_id` may ask for on `pool`."""
    if pool.tenant_id == tenant_id:
        return sorted(pool_classes(pool))
    granted = (Offering.objects.filter(pool=pool, tenant_id=tenant_id)
               .values_list("priority_classes", flat=True).first())
    return sorted(granted or [])


def priority_class_for(tenant_id: str, pool: Pool, name: str) -> PriorityClass:
    """The class a request names, refused unless it is one of the pool's that the tenant
    may use."""
    classes = pool_classes(pool)
    if name not in classes:
        raise InvalidArgument(f"priorityClass: pool {pool.id} has no class {name!r} (it has "
                              f"{', '.join(sorted(classes))})", field="priorityClass",
                              allowed=sorted(classes))
    granted = granted_classes(tenant_id, pool)
    if name not in granted:
        raise InvalidArgument(f"priorityClass: {name!r} is not granted on pool {pool.id} "
                              f"(granted: {', '.join(granted) or 'none'})",
                              field="priorityClass", allowed=granted)
    return classes[name]


def check_granted(pool: Pool, names: list[str]) -> None:
    """An offering grants only classes the pool has."""
    unknown = sorted(set(names) - set(pool_classes(pool)))
    if unknown:
        raise InvalidArgument(f"priorityClasses: pool {pool.id} has no class "
                              f"{', '.join(unknown)}", field="priorityClasses",
                              allowed=sorted(pool_classes(pool)))


@dataclass(frozen=True)
class TenantShare:
    tenant_id: str
    share: int  # its weight
    share_part: float  # S: its part of the pool's shares
    usage_gpu_hours: float  # decayed
    usage_part: float  # U: its part of the pool's decayed usage
    factor: float  # 2^(-U/S)


# Each reservation's GPU-seconds on the pool, every second weighed by its age's decay:
# the integral of count * 2^(-(now - t)/h) over the time it held, in closed form.
DECAYED_USAGE_SQL = tables("""
SELECT tenant_id, sum(gpus * %(h)s / ln(2) * (
         power(2::float8, -extract(epoch FROM %(now)s - held_until) / %(h)s)
       - power(2::float8, -extract(epoch FROM %(now)s - lower(during)) / %(h)s))) / 3600
  FROM (SELECT tenant_id, during,
               least(upper(during), coalesce(ended_at, 'infinity'), %(now)s) AS held_until,
               CASE device_class WHEN 'gpu' THEN count::float8
                    WHEN 'mig' THEN count * coalesce(
                        substring(profile FROM '^([0-9])g')::float8, 1) / %(mig)s
                    ELSE count::float8 / %(shares)s END AS gpus
          FROM {Reservation}
         WHERE pool_id = %(pool)s AND placed_at IS NOT NULL AND lower(during) < %(now)s
           AND coalesce(ended_at, 'infinity') > %(now)s - %(horizon)s::interval) held
 WHERE held_until > lower(during)
 GROUP BY tenant_id""", Reservation=Reservation)


def notice_seconds(pool: Pool) -> float:
    return float(sharing_policy(pool).get("preemptionNoticeSeconds", NOTICE_SECONDS))


def half_life_hours(pool: Pool) -> float:
    return float(sharing_policy(pool).get("fairShareHalfLifeHours", HALF_LIFE_HOURS))


def fair_shares(pool: Pool, now: datetime) -> dict[str, TenantShare]:
    """Every tenant of the pool (its owner and each offering's), with its factor."""
    weights = {pool.tenant_id: int(sharing_policy(pool).get("ownerShare", 1))}
    weights.update(Offering.objects.filter(pool=pool).values_list("tenant_id", "share"))
    hours = half_life_hours(pool)
    shares_per_gpu = pool.shares_per_gpu or DEFAULT_SHARES_PER_GPU
    with connection.cursor() as cursor:
        cursor.execute(DECAYED_USAGE_SQL, {
            "h": hours * 3600, "now": now, "pool": pool.id, "mig": MIG_SLICES,
            "shares": shares_per_gpu, "horizon": f"{hours * 20} hours"})
        usage = {tenant_id: float(used or 0) for tenant_id, used in cursor.fetchall()}
    total_share = sum(weights.values()) or 1
    total_usage = sum(usage.values())
    result = {}
    for tenant_id, share in weights.items():
        used = usage.get(tenant_id, 0.0)
        share_part = share / total_share
        usage_part = used / total_usage if total_usage > 0 else 0.0
        factor = math.pow(2, -usage_part / share_part) if share_part > 0 else 0.0
        result[tenant_id] = TenantShare(tenant_id, share, share_part, used, usage_part, factor)
    return result


@dataclass(frozen=True)
class Queued:
    """A pending request in its pool's queue."""

    reservation_id: str
    tenant_id: str
    pool_id: str
    count: int
    device_class: str
    priority_class: str
    priority: int
    factor: float
    created_at: datetime
    failure_reason: str
    position: int  # 1 is placed first
    ahead_by_priority: int  # ahead for a higher priority
    ahead_by_share: int  # same priority, a tenant with a higher fair-share factor
    ahead_by_age: int  # same priority and factor, asked earlier
    planned_start: datetime | None = None  # booked at its earliest window (planStarts)

    def why(self) -> str:
        if self.planned_start is not None:
            return (f"planned to start at {self.planned_start.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
                    " (earlier if GPUs free first)")
        ahead = [f"{n} {what}" for n, what in (
            (self.ahead_by_priority, "of a higher priority"),
            (self.ahead_by_share, "of tenants with a higher fair-share factor"),
            (self.ahead_by_age, "asked earlier")) if n]
        place = (f"{self.position - 1} ahead ({', '.join(ahead)})" if ahead
                 else "first in line")
        return f"{place}; {self.failure_reason}" if self.failure_reason else place


def planned_queue(pool: Pool, now: datetime) -> list[Queued]:
    """The pool's planned starts (reservations.services.backfill), earliest first: ahead of
    every pending request, as their GPUs are already booked."""
    rows = (Reservation.objects.filter(pool=pool, state=ReservationState.PLACED, planned=True,
                                       during__startswith__gt=now)
            .order_by("during__startswith", "id"))
    shares = fair_shares(pool, now) if rows else {}
    return [Queued(r.id, r.tenant_id, pool.id, r.count, r.device_class, r.priority_class,
                   r.priority, shares[r.tenant_id].factor if r.tenant_id in shares else 0.0,
                   r.created_at, "", position, 0, 0, 0, planned_start=r.during.lower)
            for position, r in enumerate(rows, 1)]


def waiting_queue(pool: Pool, now: datetime) -> list[Queued]:
    """Everything that waits in the pool, in the order it is offered capacity: planned
    starts first (their GPUs are booked from then), then the pending requests."""
    planned = planned_queue(pool, now)
    return planned + [replace(q, position=q.position + len(planned))
                      for q in pending_queue(pool, now)]


def accepting(pool: Pool, **state: Any) -> Q:
    """Requests of other pools of `pool`'s site that accept its GPU model, by tenants that
    may book it (its owner, and those it is offered to)."""
    tenants = [pool.tenant_id, *Offering.objects.filter(pool=pool)
               .values_list("tenant_id", flat=True)]
    return Q(pool__site_id=pool.site_id, gpu_models__contains=[pool.gpu_model.upper()],
             tenant_id__in=tenants, **state) & ~Q(pool=pool)


def pending_queue(pool: Pool, now: datetime, *, movable: bool = False) -> list[Queued]:
    """The pool's pending requests in the order they are offered capacity; with `movable`,
    those waiting in other pools that accept this pool's model too (pending_place offers
    them its capacity; priorities and preemption stay with each request's own pool)."""
    waiting = Q(pool=pool, state=ReservationState.PENDING)
    if movable and pool.gpu_model:
        waiting |= accepting(pool, state=ReservationState.PENDING)
    # A gang waits as one request, its member 0, asking for all its members' atoms.
    rows = [(*row[:6], row[6] * (row[9] or 1), *row[7:9]) for row in
            Reservation.objects.filter(waiting, gang_index=0)
            .values_list("id", "tenant_id", "priority_class", "priority", "created_at",
                         "failure_reason", "count", "device_class", "pool_id", "gang__nodes")]
    if not rows:
        return []
    shares = fair_shares(pool, now)
    factors = {tenant_id: round(share.factor, 6) for tenant_id, share in shares.items()}
    rows.sort(key=lambda r: (-r[3], -factors.get(r[1], 0.0), r[4], r[0]))
    first_of_priority: dict[int, int] = {}  # where each priority, and each (priority,
    first_of_factor: dict[tuple[int, float], int] = {}  # factor), starts in the order
    queue = []
    for index, (rsv_id, tenant_id, name, priority, created, reason, count,
                device_class, home) in enumerate(rows):
        factor = factors.get(tenant_id, 0.0)
        by_priority = first_of_priority.setdefault(priority, index)
        by_share = first_of_factor.setdefault((priority, factor), index) - by_priority
        queue.append(Queued(rsv_id, tenant_id, home, count, device_class, name, priority,
                            factor, created, reason, index + 1, by_priority, by_share,
                            index - by_priority - by_share))
    return queue
