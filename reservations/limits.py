"""Limits against hoarding, set per offering: how long a reservation may last, how far ahead
it may start, and how many GPUs a tenant may hold at any one moment. The pool's owner has
no offering and no limits.

`maxGpusAtOnce` counts over time, like the host share: a tenant may hold 16 GPUs today and
16 tomorrow under a limit of 16. It is checked under the tenant's GPU quota row lock (every
offering has that row), in a statement after taking it, so concurrent bookings and
extensions of one tenant take turns and each sees the one before.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from compute.core.errors import LimitExceeded
from compute.core.sqltext import tables
from fleet.models import Pool
from reservations.models import Offering, Quota, Reservation

HOUR_MS = 3_600_000

# The most whole GPUs the tenant's live reservations of the pool (other than %(skip)s) hold at one
# moment of %(during)s. A pending reservation counts over the window it asked for.
AT_ONCE_SQL = tables("""
WITH spans AS (
  SELECT r.count,
         greatest(lower(w.during), lower(%(during)s::tstzrange)) AS lo,
         least(upper(w.during), upper(%(during)s::tstzrange)) AS hi
    FROM {Reservation} r,
         LATERAL (SELECT coalesce(r.during, tstzrange(coalesce(r.requested_start, now()),
                  coalesce(r.requested_start, now()) + r.duration_ms * interval '1 ms',
                  '[)')) AS during) w
   WHERE r.tenant_id = %(tenant)s AND r.pool_id = %(pool)s AND r.id <> %(skip)s
     AND r.device_class = 'gpu'
     AND r.state IN ('pending', 'placed', 'binding', 'active')
     AND w.during && %(during)s)
SELECT coalesce(max(held), 0) FROM (
  SELECT sum(delta) OVER (ORDER BY at, starts) AS held FROM (
    SELECT lo AS at, 1 AS starts, count AS delta FROM spans
    UNION ALL
    SELECT hi, 0, -count FROM spans) edges) running""", Reservation=Reservation)


def offering_limits(tenant_id: str, pool: Pool) -> dict[str, Any]:
    """The limits of the tenant's offering of the pool; none for the pool's owner."""
    if pool.tenant_id == tenant_id:
        return {}
    offering = Offering.objects.filter(pool=pool, tenant_id=tenant_id).only("limits").first()
    return dict(offering.limits) if offering else {}


def check_request(limits: dict[str, Any], *, duration_ms: int, start: datetime | None,
                  now: datetime) -> None:
    """A request's length and how far ahead it starts, against the offering's limits."""
    most_hours = limits.get("maxDurationHours")
    if most_hours is not None and duration_ms > most_hours * HOUR_MS:
        raise LimitExceeded(
            f"limit maxDurationHours: {duration_ms / HOUR_MS:g} h requested, at most "
            f"{most_hours:g} h", limit="maxDurationHours", requested=duration_ms / HOUR_MS,
            allowed=most_hours)
    ahead_days = limits.get("maxStartAheadDays")
    if ahead_days is not None and start is not None and start > now + timedelta(
            days=ahead_days):
        days = (start - now) / timedelta(days=1)
        raise LimitExceeded(
            f"limit maxStartAheadDays: starts {days:.1f} days ahead, at most {ahead_days:g}",
            limit="maxStartAheadDays", requested=round(days, 3), allowed=ahead_days)


def latest_start_allowed(limits: dict[str, Any], now: datetime) -> datetime | None:
    ahead_days = limits.get("maxStartAheadDays")
    return None if ahead_days is None else now + timedelta(days=ahead_days)


def check_at_once(limits: dict[str, Any], *, tenant_id: str, pool: Pool, gpus: int,
                  during: DateTimeTZRange, skip: str = "") -> None:
    """`gpus` more over `during` against the offering's `maxGpusAtOnce`."""
    most = limits.get("maxGpusAtOnce")
    if most is None:
        return
    with connection.cursor() as cursor:
        cursor.execute(tables("SELECT 1 FROM {Quota} WHERE tenant_id = %s AND pool_id = %s "
                       "AND resource = 'gpu' FOR NO KEY UPDATE", Quota=Quota), [tenant_id, pool.id])
        cursor.execute(AT_ONCE_SQL, {"tenant": tenant_id, "pool": pool.id, "skip": skip,
                                     "during": during})
        held = int(cursor.fetchone()[0])
    if held + gpus > most:
        raise LimitExceeded(
            f"limit maxGpusAtOnce: {held} GPUs held then + {gpus} requested > {most}",
            limit="maxGpusAtOnce", held=held, requested=gpus, allowed=most)
