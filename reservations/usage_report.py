"""The usage report: what was used between two moments, grouped by tenant, pool, meter, day
(UTC) and priority class. Closed records count for the part of their window inside the
report's; what runs and is not closed yet (since the last full hour) is added from the ledger
itself, so the report always equals what the bookings held."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from django.db import connection
from django.db.models import Q

from compute.core.sqltext import tables
from compute.platform.tenancy.models import Tenant
from reservations.models import Reservation, Sandbox, SandboxState, UsageRecord
from reservations.services.metering import gpu_meter, hourly, hours
from reservations.services.sandbox_use import paused_rate
from reservations.services.usage_close import RUNNING
from reservations.states import HOLDING

GROUPS = ("tenant", "pool", "meter", "day", "priorityClass")
SIX = Decimal("0.000001")

CLOSED_SQL = tables("""
SELECT t.slug, coalesce(u.pool_id, ''), u.meter, u.priority_class,
       (greatest(u.window_start, %(from)s) AT TIME ZONE 'UTC')::date,
       sum(u.quantity * EXTRACT(EPOCH FROM least(u.window_end, %(to)s)
                                           - greatest(u.window_start, %(from)s))
           / EXTRACT(EPOCH FROM u.window_end - u.window_start))
  FROM {UsageRecord} u JOIN {Tenant} t ON t.id = u.tenant_id
 WHERE u.window_start < %(to)s AND u.window_end > %(from)s
   AND u.window_end > u.window_start AND (%(tenant)s::text IS NULL OR u.tenant_id = %(tenant)s)
 GROUP BY 1, 2, 3, 4, 5""", UsageRecord=UsageRecord, Tenant=Tenant)


@dataclass(frozen=True)
class Key:
    tenant: str
    pool: str
    meter: str
    priority_class: str
    day: date


def usage_report(*, tenant: Tenant, start: datetime, end: datetime, now: datetime,
                 group_by: tuple[str, ...]) -> list[dict[str, str | None]]:
    """Rows of the report, one per group, largest first; the root tenant's covers every
    tenant."""
    only = None if tenant.is_root else tenant.id
    found: dict[Key, Decimal] = {}
    if end <= start:
        return []
    with connection.cursor() as cursor:
        cursor.execute(CLOSED_SQL, {"from": start, "to": end, "tenant": only})
        for slug, pool_id, meter, priority, day, quantity in cursor.fetchall():
            key = Key(slug, pool_id, meter, priority, day)
            found[key] = found.get(key, Decimal(0)) + Decimal(quantity)
    for key, quantity in unclosed(only, start, min(end, now)):
        found[key] = found.get(key, Decimal(0)) + quantity
    return grouped(found, group_by)


def unclosed(tenant_id: str | None, start: datetime, end: datetime
             ) -> list[tuple[Key, Decimal]]:
    """What runs and was metered only up to its last close, inside [start, end)."""
    if end <= start:
        return []
    parts: list[tuple[Key, Decimal]] = []
    mine = Q(tenant_id=tenant_id) if tenant_id else Q()
    live = (Reservation.objects.filter(mine, state__in=HOLDING, during__startswith__lt=end)
            .select_related("pool", "tenant"))
    for rsv in live:
        if rsv.during is None:
            continue
        since = max(rsv.metered_until or rsv.during.lower, start)
        meter = gpu_meter(rsv.pool.gpu_model, rsv.device_class, rsv.profile)
        for lower, upper in hourly(since, min(end, rsv.during.upper)):
            parts.append((Key(rsv.tenant.slug, rsv.pool_id, meter, rsv.priority_class,
                              lower.date()), hours(lower, upper) * rsv.count))
    for sandbox in (Sandbox.objects.filter(mine, state__in=RUNNING)
                    .select_related("pool", "tenant")):
        since = sandbox.metered_from or sandbox.started_at
        if since is None:
            continue
        rate = Decimal(str(paused_rate(sandbox) if sandbox.state == SandboxState.PAUSED else 1.0))
        for lower, upper in hourly(max(since, start), end):
            for meter, count in (("vcpu.hours", sandbox.vcpus),
                                 ("memory.gib-hours", sandbox.memory_gib)):
                parts.append((Key(sandbox.tenant.slug, sandbox.pool_id, meter, "",
                                  lower.date()), hours(lower, upper) * count * rate))
    return parts


def grouped(found: dict[Key, Decimal], group_by: tuple[str, ...]
            ) -> list[dict[str, str | None]]:
    sums: dict[tuple[str | None, ...], Decimal] = {}
    for key, quantity in found.items():
        values = {"tenant": key.tenant, "pool": key.pool or None, "meter": key.meter,
                  "day": key.day.isoformat(), "priorityClass": key.priority_class or None}
        group = tuple(values[g] if g in group_by else None for g in GROUPS)
        sums[group] = sums.get(group, Decimal(0)) + quantity
    rows = [{**dict(zip(GROUPS, group, strict=True)), "quantity": str(total.quantize(SIX))}
            for group, total in sums.items()]
    return sorted(rows, key=lambda row: (-Decimal(str(row["quantity"])),
                                         [str(row[g] or "") for g in GROUPS]))
