"""Moving a reservation's end: grow it while its GPUs are free, or shorten it."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction

from audit.services import audit_record, audited
from compute.core.db import constraint_errors, database_now
from compute.core.errors import CapacityConflict, InvalidArgument, InvalidState
from compute.core.sqltext import tables
from compute.platform.events.services import event_emit
from compute.platform.tenancy.models import Principal, Tenant
from fleet.models import Node
from fleet.services.specs import node_spec_change_locked
from reservations.budgets import check_budgets
from reservations.candidates import window
from reservations.constraints import (
    LEDGER_CONSTRAINTS,
    NODE_MEMORY_WITHIN_SIZE,
    NODE_VCPUS_WITHIN_SIZE,
    bookings_refereed,
)
from reservations.events import ReservationEvent
from reservations.hostshare import host_counters_refresh, node_lock
from reservations.limits import check_at_once, check_request, offering_limits
from reservations.models import Allocation, Booking, Reservation, ReservationState
from reservations.selectors import access_reservation_by_id
from reservations.services.gang import locked_members
from reservations.services.holds import hold_of
from reservations.services.release import live_allocation
from reservations.states import TERMINAL
from reservations.work import pool_replan

HELD = (ReservationState.BINDING, ReservationState.ACTIVE)  # the hold is in the node's spec


@audited
def reservation_extend(*, tenant: Tenant, actor: Principal, reservation_id: str,
                       by_ms: int) -> Reservation:
    """Move the end of a reservation by `by_ms` (negative shortens it).

    Growing fails with a `capacity_conflict` naming the window that blocks it; shortening
    never ends before now (use release for that).
    """
    rsv = access_reservation_by_id(tenant=tenant, reservation_id=reservation_id)
    members = locked_members(rsv.id, rsv.gang_id)  # a gang's members all move together
    rsv = next(m for m in members if m.id == rsv.id)
    if rsv.state in TERMINAL:
        raise InvalidState(f"reservation {rsv.id} is {rsv.state}", state=rsv.state)
    if by_ms == 0:
        raise InvalidArgument("by: must not be zero", field="by")
    new_duration = rsv.duration_ms + by_ms
    if new_duration <= 0:
        raise InvalidArgument("by: would end the reservation before it starts", field="by")
    now = database_now()
    limits = offering_limits(rsv.tenant_id, rsv.pool) if by_ms > 0 else {}
    check_request(limits, duration_ms=new_duration, start=None, now=now)
    live = [(m, live_allocation(m)) for m in members if m.state not in TERMINAL]
    for member, allocation in sorted(live, key=lambda pair: pair[1].node_id if pair[1] else ""):
        _move(member, allocation, by_ms, now)  # nodes in id order
    during = rsv.during or window(rsv.requested_start or now, new_duration)
    # A gang's members count among what is held once moved: check with nothing added.
    gpus, skip = (0, "") if rsv.gang_id else (rsv.count, rsv.id)
    check_at_once(limits, tenant_id=rsv.tenant_id, pool=rsv.pool, gpus=gpus,
                  skip=skip, during=during)
    if rsv.device_class == "gpu":
        check_budgets(limits, tenant_id=rsv.tenant_id, pool=rsv.pool, gpus=gpus,
                      skip=skip, during=during, priority_class=rsv.priority_class)
    if by_ms < 0:
        pool_replan(rsv.pool_id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="reservation.extend",
                 target=rsv.id, data={"byMs": by_ms})
    event_emit(tenant_id=tenant.id, type=ReservationEvent.RESERVATION_EXTENDED, subject=rsv.id,
               payload={"byMs": by_ms, "end": rsv.ends_at})
    return rsv


def _move(rsv: Reservation, allocation: Allocation | None, by_ms: int, now: datetime) -> None:
    """Move one reservation's end (and its bookings', and its node's spec) by `by_ms`."""
    if rsv.during is not None:
        old_end = rsv.during.upper
        new_end = old_end + timedelta(milliseconds=by_ms)
        if new_end <= max(now, rsv.during.lower):
            raise InvalidArgument("by: the new end is in the past; release it instead",
                                  field="by")
        if allocation is not None:
            node_lock(allocation.node_id)
            _move_end(rsv, allocation, old_end, new_end)
            _recount_host_share(rsv, allocation, new_end)
        rsv.during = type(rsv.during)(rsv.during.lower, new_end, "[)")
    rsv.duration_ms += by_ms
    rsv.ending_notice_sent = None  # a new end: its notices are due again
    rsv.save(update_fields=["during", "duration_ms", "ending_notice_sent"])
    if allocation is not None and rsv.state in HELD:
        # The node tells the hold's workloads its end (and ends its Slurm reservation then):
        # the new end.
        node_spec_change_locked(Node.objects.get(pk=allocation.node_id),
                                add=hold_of(allocation, rsv).wire())


def _move_end(rsv: Reservation, allocation: Allocation, old_end: datetime,
              new_end: datetime) -> None:
    try:
        with transaction.atomic(), constraint_errors(LEDGER_CONSTRAINTS), \
                connection.cursor() as cursor:
            cursor.execute(
                    tables("UPDATE {Booking} SET during = tstzrange(lower(during), %s, "
                    "'[)') WHERE allocation_id = %s", Booking=Booking), [new_end, allocation.id])
            bookings_refereed(allocation_id=allocation.id)
    except CapacityConflict:
        blocking = _blocking_window(allocation, old_end, new_end)
        raise CapacityConflict(
            f"cannot extend {rsv.id} to {new_end.isoformat()}: its GPUs are booked from "
            f"{blocking[0].isoformat()} to {blocking[1].isoformat()}",
            blockedFrom=blocking[0], blockedUntil=blocking[1]) from None


def _recount_host_share(rsv: Reservation, allocation: Allocation, new_end: datetime) -> None:
    """The node's counters with the longer window; refused when its vCPUs or memory are
    held by other bookings or sandboxes in the extension."""
    def refused(resource: str) -> CapacityConflict:
        return CapacityConflict(f"cannot extend {rsv.id} to {new_end.isoformat()}: the node's "
                                f"{resource} are held by other bookings or sandboxes then",
                                resource=resource)

    with constraint_errors({NODE_VCPUS_WITHIN_SIZE: lambda: refused("vCPUs"),
                            NODE_MEMORY_WITHIN_SIZE: lambda: refused("memory")}):
        host_counters_refresh(allocation.node_id)


def _blocking_window(allocation: Allocation, old_end: datetime,
                     new_end: datetime) -> tuple[datetime, datetime]:
    """The earliest other booking of this allocation's devices inside the extension."""
    with connection.cursor() as cursor:
        cursor.execute(
            tables("SELECT lower(other.during), upper(other.during) FROM {Booking} other "
            "JOIN {Booking} mine ON mine.device_id = other.device_id "
            "WHERE mine.allocation_id = %s AND other.allocation_id IS DISTINCT FROM %s "
            "AND other.during && tstzrange(%s, %s, '[)') "
            "ORDER BY lower(other.during) LIMIT 1",
                Booking=Booking), [allocation.id, allocation.id, old_end,
                                                     new_end])
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (old_end, new_end)
