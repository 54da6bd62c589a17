"""Idle reclaim, per offering (`limits.idleReclaim`): an active reservation whose GPUs all
report utilization under `belowPercent` for `forMinutes` is flagged (`reservation.idle`);
if the offering says `release`, one that stays idle `graceMinutes` longer is released with
the reason. Any busy sample clears the flag (`reservation.busy`).

Only what nodes reported counts: a node that sends no telemetry (unreachable, or an agent
without it) never makes its holds idle, so nothing is reclaimed because of liveness alone.
A MIG instance or a share is judged by its GPU's utilization.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from audit.services import audit_record, audited
from compute.core.db import database_now
from compute.core.sqltext import tables
from compute.platform.events.services import event_emit
from fleet.models.devices import GpuSample
from reservations.candidates import instant
from reservations.events import ReservationEvent
from reservations.models import Allocation, Booking, Offering, Reservation, ReservationState
from reservations.services.release import end_reservation

# The active reservations on %(node)s whose offering reclaims idle GPUs.
WATCHED_SQL = tables("""
SELECT r.id FROM {Reservation} r
  JOIN {Allocation} a ON a.reservation_id = r.id AND a.ended_at IS NULL
  JOIN {Offering} o ON o.pool_id = r.pool_id AND o.tenant_id = r.tenant_id
 WHERE a.node_id = %(node)s AND r.state = 'active' AND o.limits ? 'idleReclaim'""",
     Allocation=Allocation, Offering=Offering, Reservation=Reservation)

# Over the reservation's GPUs (whole, or those its parts are of): the busiest sample since
# %(since)s, and the first sample since its start (how long it has been watched).
SAMPLES_SQL = tables("""
WITH gpus AS (
  SELECT DISTINCT b.gpu_id FROM {Booking} b
    JOIN {Allocation} a ON a.id = b.allocation_id
   WHERE a.reservation_id = %(rsv)s AND a.ended_at IS NULL)
SELECT max(s.utilization) FILTER (WHERE s.at >= %(since)s),
       min(s.at) FILTER (WHERE s.at >= %(start)s)
  FROM {GpuSample} s WHERE s.device_id IN (SELECT gpu_id FROM gpus)
   AND s.at >= least(%(since)s, %(start)s)""",
       Allocation=Allocation, Booking=Booking, GpuSample=GpuSample)


def watched_on(node_id: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(WATCHED_SQL, {"node": node_id})
        return [row[0] for row in cursor.fetchall()]


def is_idle(rsv: Reservation, rule: dict[str, Any], now: datetime) -> bool:
    """Every sample of its GPUs over the last `forMinutes` is under `belowPercent`, and
    they have been watched that long since it started."""
    if rsv.during is None:
        return False
    since = now - timedelta(minutes=float(rule["forMinutes"]))
    with connection.cursor() as cursor:
        cursor.execute(SAMPLES_SQL, {"rsv": rsv.id, "since": since,
                                     "start": rsv.during.lower})
        busiest, first = cursor.fetchone()
    return busiest is not None and first is not None and first <= since \
        and busiest < float(rule["belowPercent"])


@audited
def reservation_idle_check(*, reservation_id: str) -> Reservation | None:
    """Flag, clear or reclaim one active reservation by its offering's idle rule."""
    rsv = (Reservation.objects.select_for_update(no_key=True).select_related("pool")
           .filter(pk=reservation_id, state=ReservationState.ACTIVE).first())
    if rsv is None:
        return None
    offering = rsv.pool.offerings.filter(tenant_id=rsv.tenant_id).first()
    rule = (offering.limits if offering else {}).get("idleReclaim")
    if not rule:
        return rsv
    now = database_now()
    idle = is_idle(rsv, rule, now)
    below, minutes = rule["belowPercent"], rule["forMinutes"]
    why = f"GPUs under {below:g}% utilization for {minutes:g} min"
    if idle and rsv.idle_since is None:
        release_at = (now + timedelta(minutes=float(rule.get("graceMinutes", 10)))
                      if rule.get("release") else None)
        rsv.idle_since = now
        rsv.save(update_fields=["idle_since"])
        event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_IDLE, subject=rsv.id,
                   payload={"reason": why, "belowPercent": below, "forMinutes": minutes,
                            "releaseAt": release_at})
        audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.idle",
                     target=rsv.id, reason=why,
                     data={"releaseAt": instant(release_at) if release_at else None})
    elif idle and rule.get("release") and rsv.idle_since is not None and \
            now >= rsv.idle_since + timedelta(minutes=float(rule.get("graceMinutes", 10))):
        reason = f"reclaimed: {why}, flagged idle at {instant(rsv.idle_since)}"
        end_reservation(rsv, to=ReservationState.RELEASED, now=now, reason=reason)
        audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.reclaim",
                     target=rsv.id, reason=reason)
    elif not idle and rsv.idle_since is not None:
        rsv.idle_since = None
        rsv.save(update_fields=["idle_since"])
        event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_BUSY, subject=rsv.id,
                   payload={"reason": f"a GPU reported {below:g}% utilization or more"})
        audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.busy",
                     target=rsv.id, reason="busy again")
    return rsv
