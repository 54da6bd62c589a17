"""API methods reservations.queue (the pending queue, with each request's position and why)
and capacity.shares (each tenant's fair share of a pool)."""

from __future__ import annotations

from typing import Any

from compute.core.api.inputs import Input, PublicIdField
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import INTEGER, NUMBER, STRING, TIME, array, nullable, obj
from compute.core.db import database_now
from compute.platform.tenancy.models import Tenant
from fleet.api.pools import pool_subject
from fleet.models import Pool
from fleet.selectors import access_pool_by_id
from reservations.models import Reservation, ReservationState
from reservations.sharing import Queued, fair_shares, half_life_hours, waiting_queue

QUEUED = obj(reservationId=STRING, tenantId=STRING, poolId=STRING, position=INTEGER,
             count=INTEGER, priorityClass=STRING, priority=INTEGER, fairShare=NUMBER,
             aheadByPriority=INTEGER, aheadByShare=INTEGER, aheadByAge=INTEGER, why=STRING,
             plannedStart=nullable(TIME), createdAt=TIME, **{"class": STRING})
QUEUE = obj(items=array(QUEUED))
SHARE = obj(tenantId=STRING, tenant=STRING, share=INTEGER, sharePart=NUMBER,
            usageGpuHours=NUMBER, usagePart=NUMBER, factor=NUMBER)
SHARES = obj(poolId=STRING, halfLifeHours=NUMBER, tenants=array(SHARE))


def present_queued(entry: Queued) -> dict[str, Any]:
    return {"reservationId": entry.reservation_id, "tenantId": entry.tenant_id,
            "poolId": entry.pool_id, "position": entry.position, "count": entry.count,
            "class": entry.device_class, "priorityClass": entry.priority_class,
            "priority": entry.priority, "fairShare": round(entry.factor, 4),
            "aheadByPriority": entry.ahead_by_priority, "aheadByShare": entry.ahead_by_share,
            "aheadByAge": entry.ahead_by_age, "why": entry.why(),
            "plannedStart": entry.planned_start, "createdAt": entry.created_at}


class QueueIn(Input):
    pool_id = PublicIdField("pool", required=False)


def queue_pools(tenant: Tenant, pool_id: str | None) -> list[Pool]:
    """The named pool, or every pool the tenant owns or waits on."""
    if pool_id:
        return [access_pool_by_id(tenant=tenant, pool_id=pool_id)]
    waiting = set(Reservation.objects.filter(tenant=tenant, state=ReservationState.PENDING)
                  .values_list("pool_id", flat=True))
    return list(Pool.objects.filter(pk__in=waiting) | Pool.objects.filter(tenant=tenant))


@endpoint("reservations", "queue", returns=QUEUE, input=QueueIn, mutating=False)
def reservations_queue(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Waiting requests in the order they are offered capacity: planned starts first (their
    GPUs are booked from then), then pending ones (priority, fair share, age), each with its
    position and why it waits: all of an owned pool's, else the tenant's own."""
    now, items = database_now(), []
    for pool in queue_pools(ctx.tenant, data.get("pool_id")):
        items += [present_queued(q) for q in waiting_queue(pool, now)
                  if pool.tenant_id == ctx.tenant.id or q.tenant_id == ctx.tenant.id]
    return {"items": items}


class SharesIn(Input):
    pool_id = PublicIdField("pool")


@endpoint("capacity", "shares", returns=SHARES, input=SharesIn, mutating=False,
          subject=pool_subject())
def capacity_shares(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Each tenant's share of the pool, its decayed usage and its fair-share factor: every
    tenant for the pool's owner, the caller's own row for a tenant it is offered to."""
    pool = ctx.subject
    shares = fair_shares(pool, database_now())
    slugs = dict(Tenant.objects.filter(pk__in=list(shares)).values_list("id", "slug"))
    rows = [{"tenantId": s.tenant_id, "tenant": slugs.get(s.tenant_id, ""), "share": s.share,
             "sharePart": round(s.share_part, 4), "usageGpuHours": round(s.usage_gpu_hours, 3),
             "usagePart": round(s.usage_part, 4), "factor": round(s.factor, 4)}
            for s in sorted(shares.values(), key=lambda s: -s.factor)
            if pool.tenant_id == ctx.tenant.id or s.tenant_id == ctx.tenant.id]
    return {"poolId": pool.id, "halfLifeHours": half_life_hours(pool), "tenants": rows}
