"""GPU-hour budgets per period, set per offering (`limits.budgets`): how many GPU-hours a
tenant may book in a pool each day, week or month, in all or in one priority class.

What counts is what is booked, not only what was used: every live reservation (pending ones
over the window they asked for, future ones too) for the part of its window inside the
period, and every released one for the time it held. A booking that would take a period past
its budget is refused (`409 limit_exceeded`, naming the budget and the numbers); a booking
that spans two periods counts in each for its part there. Periods start at midnight, on
Mondays or on the 1st, in the pool's time zone (policy `timeZone`, UTC by default).

It is checked under the tenant's GPU quota row lock, as `maxGpusAtOnce` is, so concurrent
bookings of one tenant take turns and each sees the one before.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from compute.core.errors import LimitExceeded
from compute.core.sqltext import tables
from fleet.models import Pool
from reservations.models import Quota, Reservation

PERIODS = ("day", "week", "month")

# GPU-hours the tenant's reservations of the pool (of one class, or all) book inside a period.
BOOKED_SQL = tables("""
SELECT coalesce(sum(r.count * EXTRACT(EPOCH FROM
         least(upper(w.during), %(end)s) - greatest(lower(w.during), %(start)s)) / 3600), 0)
  FROM {Reservation} r,
       LATERAL (SELECT CASE
         WHEN r.state = 'released' THEN
           tstzrange(lower(r.during), least(upper(r.during), coalesce(r.ended_at,
                                                                  upper(r.during))), '[)')
         ELSE coalesce(r.during, tstzrange(coalesce(r.requested_start, now()),
                coalesce(r.requested_start, now()) + r.duration_ms * interval '1 ms', '[)'))
         END AS during) w
 WHERE r.tenant_id = %(tenant)s AND r.pool_id = %(pool)s AND r.id <> %(skip)s
   AND r.device_class = 'gpu'
   AND r.state IN ('pending', 'placed', 'binding', 'active', 'released')
   AND (%(class)s::text IS NULL OR r.priority_class = %(class)s)
   AND w.during && tstzrange(%(start)s, %(end)s, '[)')""", Reservation=Reservation)


@dataclass(frozen=True)
class Budget:
    hours: float
    period: str
    priority_class: str | None

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Budget:
        return cls(float(raw["gpuHours"]), raw["period"], raw.get("priorityClass"))

    def name(self) -> str:
        scope = f" of class {self.priority_class}" if self.priority_class else ""
        return f"budget {self.hours:g} GPU-hours per {self.period}{scope}"


def pool_zone(pool: Pool) -> ZoneInfo:
    return ZoneInfo(str(pool.policy.get("timeZone") or "UTC"))


def period_of(moment: datetime, period: str, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The period (day, week from Monday, month) holding `moment`, in `zone`."""
    local = moment.astimezone(zone)
    start = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        start -= timedelta(days=start.weekday())
    elif period == "month":
        start = start.replace(day=1)
    if period == "day":
        end = start + timedelta(days=1)
    elif period == "week":
        end = start + timedelta(days=7)
    else:
        end = (start + timedelta(days=32)).replace(day=1)
    # (midnight in the zone, whatever daylight saving did in between)
    return (start.replace(tzinfo=None).replace(tzinfo=zone),
            end.replace(tzinfo=None).replace(tzinfo=zone))


def periods_over(during: DateTimeTZRange, period: str, zone: ZoneInfo
                 ) -> list[tuple[datetime, datetime]]:
    """Every period that `during` touches."""
    found, moment = [], during.lower
    while moment < during.upper:
        start, end = period_of(moment, period, zone)
        found.append((start, end))
        moment = end
    return found


def booked_hours(*, tenant_id: str, pool: Pool, start: datetime, end: datetime,
                 priority_class: str | None, skip: str = "") -> Decimal:
    with connection.cursor() as cursor:
        cursor.execute(BOOKED_SQL, {"tenant": tenant_id, "pool": pool.id, "skip": skip,
                                    "class": priority_class, "start": start, "end": end})
        return Decimal(cursor.fetchone()[0])


def check_budgets(limits: dict[str, Any], *, tenant_id: str, pool: Pool, gpus: int,
                  during: DateTimeTZRange, priority_class: str, skip: str = "") -> None:
    """`gpus` more over `during` against each budget of the offering that applies."""
    budgets = [Budget.from_wire(raw) for raw in limits.get("budgets", [])]
    budgets = [b for b in budgets if b.priority_class in (None, priority_class)]
    if not budgets:
        return
    with connection.cursor() as cursor:
        cursor.execute(tables("SELECT 1 FROM {Quota} WHERE tenant_id = %s AND pool_id = %s "
                              "AND resource = 'gpu' FOR NO KEY UPDATE", Quota=Quota),
                       [tenant_id, pool.id])
    zone = pool_zone(pool)
    for budget in budgets:
        for start, end in periods_over(during, budget.period, zone):
            part = min(end, during.upper) - max(start, during.lower)
            requested = Decimal(gpus) * Decimal(part.total_seconds()) / 3600
            booked = booked_hours(tenant_id=tenant_id, pool=pool, start=start, end=end,
                                  priority_class=budget.priority_class, skip=skip)
            if booked + requested > Decimal(str(budget.hours)) + Decimal("0.000001"):
                raise LimitExceeded(
                    f"limit {budget.name()}: {booked:.2f} GPU-hours booked in the "
                    f"{budget.period} from {start.date().isoformat()} + {requested:.2f} "
                    f"requested > {budget.hours:g}", limit="budget", period=budget.period,
                    periodStart=start, booked=round(float(booked), 6),
                    requested=round(float(requested), 6), allowed=budget.hours,
                    priorityClass=budget.priority_class)


def budget_standing(limits: dict[str, Any], *, tenant_id: str, pool: Pool, now: datetime
                    ) -> list[dict[str, Any]]:
    """Each budget of the offering in its current period: booked and used (up to now)."""
    zone = pool_zone(pool)
    standing = []
    for budget in (Budget.from_wire(raw) for raw in limits.get("budgets", [])):
        start, end = period_of(now, budget.period, zone)
        booked = booked_hours(tenant_id=tenant_id, pool=pool, start=start, end=end,
                              priority_class=budget.priority_class)
        used = booked_hours(tenant_id=tenant_id, pool=pool, start=start, end=now,
                            priority_class=budget.priority_class)
        standing.append({"gpuHours": budget.hours, "period": budget.period,
                         "priorityClass": budget.priority_class, "periodStart": start,
                         "periodEnd": end, "booked": str(booked.quantize(Decimal("0.01"))),
                         "used": str(used.quantize(Decimal("0.01")))})
    return standing
