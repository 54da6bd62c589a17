"""Ending reservations: release, cancel and the end of a window."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from audit.services import audit_record, audited
from compute.core.db import database_now
from compute.core.errors import InvalidState
from compute.core.sqltext import tables
from compute.platform.events.services import event_emit
from compute.platform.tenancy.models import Principal, Tenant
from fleet.models import Node
from fleet.services.specs import node_spec_change_locked
from reservations.events import ReservationEvent
from reservations.hostshare import host_counters_refresh, node_lock
from reservations.models import Allocation, Booking, Reservation, ReservationState
from reservations.quotas import quota_refund
from reservations.selectors import access_reservation_by_id
from reservations.services.book import try_place
from reservations.services.booking import gang_of
from reservations.services.gang import live_members, lock_gang, locked_members
from reservations.services.metering import reservation_meter
from reservations.states import HOLDING, TERMINAL, transition
from reservations.work import pool_replan

ENDED_EVENT: dict[str, ReservationEvent] = {
    ReservationState.RELEASED: ReservationEvent.RESERVATION_RELEASED,
    ReservationState.CANCELLED: ReservationEvent.RESERVATION_CANCELLED,
    ReservationState.FAILED: ReservationEvent.RESERVATION_FAILED}


def live_allocation(rsv: Reservation) -> Allocation | None:
    return rsv.allocations.filter(ended_at__isnull=True).first()


def free_allocation(allocation: Allocation, now: datetime, *, keep_history: bool) -> None:
    """End an allocation: its bookings end at `now` (or vanish if they had not started), and
    the node's host counters give back its share."""
    node_lock(allocation.node_id)
    if keep_history:
        with connection.cursor() as cursor:
            cursor.execute(
                tables("UPDATE {Booking} SET during = tstzrange(lower(during), "
                "LEAST(upper(during), %s), '[)') WHERE allocation_id = %s",
                    Booking=Booking), [now, allocation.id])
    else:
        Booking.objects.filter(allocation=allocation).delete()
    allocation.ended_at = now
    allocation.save(update_fields=["ended_at"])
    host_counters_refresh(allocation.node_id)


def end_reservation(rsv: Reservation, *, to: str, now: datetime, reason: str = "") -> None:
    """Move a reservation to released, cancelled or failed and give back all it holds; the
    pool's pending reservations are offered the freed capacity. A gang's member ends with
    every other member of its gang (each released, or cancelled where it had not started).

    Inside the caller's service, which holds the reservation row's lock (every member's,
    for a gang: gang.locked_members) and writes the audit row.
    """
    _end_one(rsv, to=to, now=now, reason=reason)
    if rsv.gang_id:
        for member in live_members(lock_gang(rsv.gang_id)):
            _end_one(member, to=_ending_state(member, to, now), now=now, reason=reason)


def _ending_state(member: Reservation, to: str, now: datetime) -> str:
    started = member.during is not None and member.during.lower <= now
    if to == ReservationState.RELEASED and not (started and member.state in HOLDING):
        return ReservationState.CANCELLED
    return to


def _end_one(rsv: Reservation, *, to: str, now: datetime, reason: str) -> None:
    allocation = live_allocation(rsv)
    started = rsv.during is not None and rsv.during.lower <= now
    # The quota row before the node's (the ledger's lock order, as booking takes them).
    if not rsv.borrowed:  # a borrowed one consumed none
        quota_refund(tenant_id=rsv.tenant_id, pool=rsv.pool, resource=rsv.device_class,
                     count=rsv.count)
    if allocation is not None:
        if rsv.state in (ReservationState.BINDING, ReservationState.ACTIVE):
            node = Node.objects.select_for_update(no_key=True).get(pk=allocation.node_id)
            node_spec_change_locked(node, remove=allocation.id)  # the node gives it back
        free_allocation(allocation, now, keep_history=started)
    if rsv.during is not None and started and to == ReservationState.RELEASED:
        reservation_meter(rsv, now)
    transition(rsv, to)
    rsv.ended_at = now
    rsv.failure_reason = reason[:300] or rsv.failure_reason
    rsv.save(update_fields=["state", "ended_at", "failure_reason"])
    pool_replan(rsv.pool_id)
    event_emit(tenant_id=rsv.tenant_id, type=ENDED_EVENT[to], subject=rsv.id,
               payload={"poolId": rsv.pool_id, "gpus": rsv.count,
                        "nodeId": allocation.node_id if allocation else None,
                        **({"reason": reason} if reason else {}), **gang_of(rsv)})


@audited
def reservation_release(*, tenant: Tenant, actor: Principal, reservation_id: str,
                        cancel: bool = False) -> Reservation:
    """Release a reservation: its bookings end at the database's now(), quota is refunded.

    One that has not started (pending, or placed for a later start) is withdrawn
    (cancelled). With `cancel`, one that has started is refused: release it instead.
    """
    rsv = access_reservation_by_id(tenant=tenant, reservation_id=reservation_id)
    rsv = next(m for m in locked_members(rsv.id, rsv.gang_id) if m.id == rsv.id)
    if rsv.state in TERMINAL:
        raise InvalidState(f"reservation {rsv.id} is already {rsv.state}", state=rsv.state)
    now = database_now()
    started = rsv.state in HOLDING and rsv.during is not None and rsv.during.lower <= now
    if cancel and started:
        raise InvalidState(f"reservation {rsv.id} has started; release it instead of "
                           "cancelling", state=rsv.state)
    to = ReservationState.RELEASED if started else ReservationState.CANCELLED
    end_reservation(rsv, to=to, now=now)
    verb = "release" if started else "cancel"
    audit_record(tenant_id=rsv.tenant_id, actor_id=actor.id, action=f"reservation.{verb}",
                 target=rsv.id)
    return rsv


@audited
def reservation_expire(*, reservation_id: str) -> Reservation | None:
    """Release one reservation whose window has ended (no-op otherwise)."""
    now = database_now()
    if Reservation.objects.filter(pk=reservation_id, gang__isnull=False).exists():
        rsv: Reservation | None = next(m for m in locked_members(reservation_id)
                                       if m.id == reservation_id)
        if rsv is not None and not (rsv.state in HOLDING and rsv.during is not None
                                    and rsv.during.upper <= now):
            rsv = None  # its gang ended it with another member
    else:
        rsv = (Reservation.objects.select_for_update(no_key=True, skip_locked=True)
               .select_related("pool")
               .filter(pk=reservation_id, state__in=HOLDING, during__endswith__lte=now).first())
    if rsv is not None:
        end_reservation(rsv, to=ReservationState.RELEASED, now=now)
        audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.expire",
                     target=rsv.id, reason="window ended")
    return rsv


def place_again(rsv: Reservation, now: datetime, *, excluded: set[str] | None = None
                ) -> tuple[Allocation, Allocation | None]:
    """Take a placed reservation that has not started off its node and place it again
    (never on `excluded` nodes); its old allocation and its new one (None: pending). A
    gang's member goes to a node its gang does not use, or, when none is left, the whole
    gang waits pending (the caller holds every member's row)."""
    old = rsv.allocations.get(ended_at__isnull=True)
    _unplace(rsv, old, now)
    excluded = set(excluded or ())
    others = Allocation.objects.filter(reservation__gang_id=rsv.gang_id, ended_at__isnull=True)
    if rsv.gang_id:
        excluded |= set(others.values_list("node_id", flat=True))
    placed = try_place(rsv, rsv.pool, now, excluded=excluded)
    if placed is None and rsv.gang_id:
        for allocation in others.select_related("reservation"):
            _unplace(allocation.reservation, allocation, now)
    return old, placed


def _unplace(rsv: Reservation, allocation: Allocation, now: datetime) -> None:
    free_allocation(allocation, now, keep_history=False)
    transition(rsv, ReservationState.PENDING)
    rsv.during, rsv.placed_at = None, None
    rsv.save(update_fields=["state", "during", "placed_at"])
