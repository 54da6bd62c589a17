"""Notice before a reservation ends: `reservation.ending`, sent at each of the pool's
`endingNotices` (seconds before the end; 15 minutes and 1 minute by default, none for []),
once each per end (an extension moves the end and they are due again), so that a webhook
or a watcher can warn the reservation's owner. When several fall due at once (a short
booking), only the nearest is sent."""

from __future__ import annotations

from datetime import timedelta

from audit.services import audit_exempt, audited
from compute.core.db import database_now
from compute.core.sqltext import tables
from compute.platform.events.services import event_emit
from fleet.models import Pool
from reservations.events import ReservationEvent
from reservations.models import Reservation, ReservationState

NOTICES = (900.0, 60.0)
STARTED = (ReservationState.BINDING, ReservationState.ACTIVE)

# Started reservations with a notice due, by their pool's policy (as `notice_due` decides).
ENDING_DUE = tables("""
SELECT r.id FROM {Reservation} r JOIN {Pool} p ON p.id = r.pool_id
 WHERE r.state IN ('binding', 'active')
   AND lower(r.during) <= %(now)s AND upper(r.during) > %(now)s
   AND EXISTS (
       SELECT 1 FROM jsonb_array_elements_text(
                         coalesce(p.policy->'endingNotices', %(default)s::jsonb)) notice
        WHERE (r.ending_notice_sent IS NULL OR notice::float8 < r.ending_notice_sent)
          AND upper(r.during) <= %(now)s + make_interval(secs => notice::float8))
 LIMIT %(limit)s""", Reservation=Reservation, Pool=Pool)
DEFAULT_JSON = "[900, 60]"


def ending_notices(pool: Pool) -> list[float]:
    return sorted(float(n) for n in pool.policy.get("endingNotices", NOTICES))


def notice_due(rsv: Reservation) -> float | None:
    """The nearest notice of `rsv` due now and not sent (seconds before its end), if any."""
    now = database_now()
    if rsv.state not in STARTED or rsv.during is None or not (
            rsv.during.lower <= now < rsv.during.upper):
        return None
    left = rsv.during.upper - now
    due = [n for n in ending_notices(rsv.pool) if left <= timedelta(seconds=n)
           and (rsv.ending_notice_sent is None or n < rsv.ending_notice_sent)]
    return min(due) if due else None


@audited
def reservation_ending_notice(*, reservation_id: str) -> float | None:
    """Send the `reservation.ending` notice due for a started reservation; which (seconds
    before its end), or None."""
    rsv = (Reservation.objects.select_for_update(no_key=True).select_related("pool")
           .filter(pk=reservation_id).first())
    notice = notice_due(rsv) if rsv is not None else None
    if rsv is None or rsv.during is None or notice is None:
        audit_exempt("no notice is due")
        return None
    now = database_now()
    rsv.ending_notice_sent = notice
    rsv.save(update_fields=["ending_notice_sent"])
    allocation = rsv.allocations.filter(ended_at__isnull=True).first()
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_ENDING,
               subject=rsv.id,
               payload={"poolId": rsv.pool_id, "end": rsv.during.upper, "notice": notice,
                        "inSeconds": round((rsv.during.upper - now).total_seconds()),
                        "nodeId": allocation.node_id if allocation else None})
    audit_exempt("a notice of an end already booked: nobody decided anything")
    return notice
