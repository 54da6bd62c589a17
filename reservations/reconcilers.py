"""The ledger's level-triggered reconcilers on the work queue.

`sweep()` turns timers into work items: reservations whose window starts or ends, bindings
past their timeout, pools with pending requests. Each item's handler reads the current state
and takes one step, so running it twice, or after a lost message, is harmless.
"""

from __future__ import annotations

from django.db.models import Q

from compute.db import database_now
from compute.queue.work import enqueue, handler
from reservations.ledger import Reservation, ReservationState
from reservations.services.binding import binding_fail, binding_timeout, reservation_bind
from reservations.services.book import pending_place
from reservations.services.release import reservation_expire
from reservations.states import HOLDING
from reservations.work import POOL, RESERVATION


@handler(RESERVATION)
def reconcile_reservation(reservation_id: str) -> None:
    """One step for one reservation: end it, fail its late binding, or bind it."""
    rsv = Reservation.objects.filter(pk=reservation_id).first()
    if rsv is None or rsv.during is None:
        return
    now = database_now()
    if rsv.state in HOLDING and rsv.during.upper <= now:
        reservation_expire(reservation_id=rsv.id)
    elif rsv.state == ReservationState.BINDING and rsv.binding_started_at and \
            rsv.binding_started_at < now - binding_timeout():
        binding_fail(reservation_id=rsv.id, reason="no AllocationBound within the timeout")
    elif rsv.state == ReservationState.PLACED and rsv.during.lower <= now:
        reservation_bind(reservation_id=rsv.id)


@handler(POOL)
def reconcile_pool(pool_id: str) -> None:
    """Offer a pool's free capacity to its pending reservations, oldest first."""
    pending_place(pool_id=pool_id)


def sweep(limit: int = 500) -> int:
    """Enqueue what timers made due; cheap enough to run every half second."""
    now = database_now()
    due = (Reservation.objects.filter(
        Q(state=ReservationState.PLACED, during__startswith__lte=now)
        | Q(state__in=HOLDING, during__endswith__lte=now)
        | Q(state=ReservationState.BINDING, binding_started_at__lt=now - binding_timeout()))
        .values_list("id", flat=True)[:limit])
    count = 0
    for rsv_id in due:
        enqueue(RESERVATION, rsv_id)
        count += 1
    for pool_id in (Reservation.objects.filter(state=ReservationState.PENDING)
                    .values_list("pool_id", flat=True).distinct()):
        enqueue(POOL, pool_id)
        count += 1
    return count
