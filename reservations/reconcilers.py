"""The ledger's level-triggered passes: each reads desired and observed state and takes one
step, so running one twice (or after a lost message) is harmless."""

from __future__ import annotations

from fleet.services.sessions import nodes_mark_unreachable
from reservations.ledger import Reservation, ReservationState
from reservations.services.binding import bindings_timed_out, reservations_bind_due
from reservations.services.book import pending_place
from reservations.services.release import reservations_expire


def reconcile_reservations() -> dict[str, int]:
    """One pass: bind what starts, release what ended, place what waits. Safe to run in
    several processes at once: every step locks (or skips) the rows it changes."""
    unreachable = len(nodes_mark_unreachable())  # liveness: never releases what they hold
    expired = len(reservations_expire())
    bound = reservations_bind_due()
    timed_out = bindings_timed_out()
    placed = 0
    pools = (Reservation.objects.filter(state=ReservationState.PENDING)
             .values_list("pool_id", flat=True).distinct())
    for pool_id in list(pools):
        placed += pending_place(pool_id=pool_id)
    return {"unreachable": unreachable, "expired": expired, "bound": bound,
            "timedOut": timed_out, "placed": placed}
