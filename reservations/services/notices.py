"""Notice before a reservation ends: `reservation.ending`, sent once per end (an extension
moves the end and the notice is due again), `endingNoticeSeconds` before it (pool policy,
600 by default; 0: never), so that a webhook or a watcher can warn the reservation's owner."""

from __future__ import annotations

from datetime import timedelta

from audit.services import audit_exempt, audited
from compute.core.db import database_now
from compute.core.sqltext import tables
from compute.platform.events.services import event_emit
from fleet.models import Pool
from reservations.events import ReservationEvent
from reservations.models import Reservation, ReservationState

NOTICE_SECONDS = 600.0
STARTED = (ReservationState.BINDING, ReservationState.ACTIVE)

# Started reservations whose notice falls due, by their pool's policy.
ENDING_DUE = tables("""
SELECT r.id FROM {Reservation} r JOIN {Pool} p ON p.id = r.pool_id
 WHERE r.state IN ('binding', 'active') AND r.ending_noticed_at IS NULL
   AND lower(r.during) <= %(now)s AND upper(r.during) > %(now)s
   AND coalesce((p.policy->>'endingNoticeSeconds')::float8, %(default)s) > 0
   AND upper(r.during) <= %(now)s + make_interval(
       secs => coalesce((p.policy->>'endingNoticeSeconds')::float8, %(default)s))
 LIMIT %(limit)s""", Reservation=Reservation, Pool=Pool)


def ending_notice(pool: Pool) -> timedelta:
    return timedelta(seconds=float(pool.policy.get("endingNoticeSeconds", NOTICE_SECONDS)))


def ending_due(rsv: Reservation) -> bool:
    """Whether `rsv`'s notice falls due now (as ENDING_DUE finds it)."""
    notice, now = ending_notice(rsv.pool), database_now()
    return (rsv.state in STARTED and rsv.ending_noticed_at is None and rsv.during is not None
            and notice > timedelta(0) and rsv.during.lower <= now < rsv.during.upper
            and rsv.during.upper <= now + notice)


@audited
def reservation_ending_notice(*, reservation_id: str) -> bool:
    """Send `reservation.ending` for a started reservation whose end is within notice;
    whether it was sent."""
    rsv = (Reservation.objects.select_for_update(no_key=True).select_related("pool")
           .filter(pk=reservation_id).first())
    if rsv is None or rsv.during is None or not ending_due(rsv):
        audit_exempt("no notice is due")
        return False
    now = database_now()
    rsv.ending_noticed_at = now
    rsv.save(update_fields=["ending_noticed_at"])
    allocation = rsv.allocations.filter(ended_at__isnull=True).first()
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_ENDING,
               subject=rsv.id,
               payload={"poolId": rsv.pool_id, "end": rsv.during.upper,
                        "inSeconds": round((rsv.during.upper - now).total_seconds()),
                        "nodeId": allocation.node_id if allocation else None})
    audit_exempt("a notice of an end already booked: nobody decided anything")
    return True
