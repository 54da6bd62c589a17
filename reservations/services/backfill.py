"""Planned starts: backfill that never starves a large request (pools whose sharing policy
has `planStarts`).

The first pending request in the queue's order that fits nowhere now is booked at the
earliest window where it fits: its planned start (unless preempting makes it fit now: then
it waits for that); the next is planned once that start has come. The plan is an ordinary
future booking in the ledger, so the EXCLUDE constraint itself keeps every later request
off those GPUs in that window; a smaller request may still use them before the planned
start if it ends by then (the ranges do not meet). When GPUs free earlier, the reservation
is moved to start now, in one transaction that gives up the planned window only if the new
one is booked: a planned start only moves earlier.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q

from audit.services import audit_exempt, audit_record, audited
from compute.core.db import database_now
from compute.core.errors import CapacityConflict
from compute.platform.events.services import event_emit
from fleet.models import Pool
from reservations.candidates import instant
from reservations.events import ReservationEvent
from reservations.models import Allocation, Quota, Reservation, ReservationState
from reservations.services.book import emit_placed, place_at_earliest
from reservations.services.gang import (
    gang_of_reservation,
    gang_place,
    lock_gang,
    place_gang_at_earliest,
)
from reservations.services.pending import moved_from, place_in, place_now
from reservations.services.preemption import makes_room
from reservations.services.release import free_allocation, live_allocation
from reservations.sharing import accepting, pending_queue, sharing_policy

PLANNED_PER_PASS = 16  # pending requests, from the head of the queue, planned in one pass


def plans_starts(pool: Pool) -> bool:
    return bool(sharing_policy(pool).get("planStarts"))


def plan_starts(pool_id: str) -> int:
    """Place the head of the pool's queue now where it fits, and book the first request
    that fits nowhere now at its earliest window in this pool, unless the pool has a
    planned start still to come; how many were placed or planned. The queue includes the
    requests waiting in other pools of the site that accept this pool's model: a request
    across models is planned in whichever of its pools has room for a plan.

    One plan at a time (EASY backfilling): a plan for every waiting request would make each
    new one, and above all a long one, wait for a gap after all of them, however high its
    class; with one, a request waits at most for the queue ahead of it and one window."""
    pool = Pool.objects.get(pk=pool_id)
    now = database_now()
    if not plans_starts(pool) or Reservation.objects.filter(
            pool=pool, state=ReservationState.PLACED, planned=True,
            during__startswith__gt=now).exists():
        return 0
    done = 0
    for queued in pending_queue(pool, now, movable=True)[:PLANNED_PER_PASS]:
        rsv = reservation_plan(reservation_id=queued.reservation_id, pool_id=pool.id)
        done += rsv is not None
        if rsv is not None and rsv.planned:
            break
    return done


@audited
def reservation_plan(*, reservation_id: str, pool_id: str | None = None
                     ) -> Reservation | None:
    """Book one pending request at its earliest window (now, if it fits now), in its own
    pool or in `pool_id` (another of its site whose model it accepts, its quota moved
    there); None when another worker holds it, it is no longer pending, or no window is
    left."""
    gang_id = gang_of_reservation(reservation_id)
    if gang_id:
        return _plan_gang(gang_id, pool_id)
    rsv = (Reservation.objects.select_for_update(no_key=True, skip_locked=True)
           .filter(pk=reservation_id, state=ReservationState.PENDING, requested_start=None)
           .select_related("pool", "tenant").first())
    if rsv is None:
        audit_exempt("nothing to plan: another worker holds it, or it no longer waits")
        return None
    now = database_now()
    origin = rsv.pool_id
    target = None if pool_id in (None, origin) else Pool.objects.get(pk=pool_id)
    allocation = place_now(rsv, target, now)
    if allocation is not None:
        audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.place",
                     target=rsv.id, data={"nodeId": allocation.node_id, **moved_from(rsv, origin)},
                     reason="capacity freed")
        emit_placed(rsv, allocation)
        return rsv
    if makes_room(rsv, rsv.pool, now):
        audit_exempt("still pending: preemption makes room for it now")
        return None
    allocation = _book_earliest(rsv, target, now)
    if allocation is None:
        audit_exempt("still pending: no window within the horizon")
        return None
    start = rsv.during.lower
    rsv.requested_start = None  # it asked for as soon as it fits: it may move earlier
    rsv.planned = True
    rsv.save(update_fields=["requested_start", "planned"])
    audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.plan",
                 target=rsv.id, data={"nodeId": allocation.node_id,
                                      "plannedStart": instant(start), **moved_from(rsv, origin)},
                 reason="fits nowhere now: booked at its earliest window")
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_PLANNED,
               subject=rsv.id, payload={"poolId": rsv.pool_id, "nodeId": allocation.node_id,
                                        "gpus": rsv.count, "plannedStart": start,
                                        "end": rsv.during.upper})
    return rsv


def _plan_gang(gang_id: str, pool_id: str | None) -> Reservation | None:
    """A waiting gang placed now where all of it fits, else booked whole at its earliest
    window (its planned start); in its own pool only."""
    members = lock_gang(gang_id)
    leader = members[0]
    if pool_id not in (None, leader.pool_id) or any(
            m.state != ReservationState.PENDING or m.requested_start is not None
            for m in members):
        audit_exempt("nothing to plan: the gang no longer waits, or waits elsewhere")
        return None
    now = database_now()
    allocations = gang_place(members, leader.pool, now)
    planned = allocations is None
    if allocations is None and makes_room(leader, leader.pool, now):
        audit_exempt("still pending: preemption makes room for it now")
        return None
    if allocations is None:
        point = transaction.savepoint()
        try:
            allocations = place_gang_at_earliest(members, leader.pool, now, None)
        except CapacityConflict:
            transaction.savepoint_rollback(point)
            audit_exempt("still pending: no window within the horizon")
            return None
        transaction.savepoint_commit(point)
        for member in members:
            member.requested_start, member.planned = None, True
            member.save(update_fields=["requested_start", "planned"])
    start = leader.during.lower if leader.during else now
    audit_record(tenant_id=leader.tenant_id, actor_id="system",
                 action="reservation.plan" if planned else "reservation.place",
                 target=leader.id, reason=("fits nowhere now: booked at its earliest window"
                                           if planned else "capacity freed"),
                 data={"gangId": gang_id, "nodes": [a.node_id for a in allocations],
                       **({"plannedStart": instant(start)} if planned else {})})
    for member, allocation in zip(members, allocations, strict=True):
        if planned:
            event_emit(tenant_id=member.tenant_id, type=ReservationEvent.RESERVATION_PLANNED,
                       subject=member.id, payload={
                           "poolId": member.pool_id, "nodeId": allocation.node_id,
                           "gpus": member.count, "plannedStart": start,
                           "end": member.ends_at, "gangId": gang_id})
        else:
            emit_placed(member, allocation)
    return leader


def _book_earliest(rsv: Reservation, target: Pool | None, now: datetime) -> Allocation | None:
    """`rsv` booked at its earliest window, in its own pool or moved to `target`; None, with
    nothing changed, when no window is left."""
    point = transaction.savepoint()
    try:
        allocation = (place_at_earliest(rsv, rsv.pool, now, None) if target is None
                      else place_in(rsv, target, now, place=_at_earliest))
    except CapacityConflict:
        allocation = None
    if allocation is None:
        transaction.savepoint_rollback(point)
        rsv.requested_start = None  # the window search's, undone with the savepoint
        return None
    transaction.savepoint_commit(point)
    return allocation


def _at_earliest(rsv: Reservation, pool: Pool, now: datetime) -> Allocation:
    return place_at_earliest(rsv, pool, now, None)


def start_planned_earlier(pool_id: str) -> int:
    """Move the planned reservations that now fit in the pool to start now, earliest
    planned first: its own, and those planned in other pools that accept its model; how
    many moved."""
    pool = Pool.objects.get(pk=pool_id)
    now = database_now()
    later = {"state": ReservationState.PLACED, "planned": True, "during__startswith__gt": now}
    planned = Q(pool=pool, **later)
    if pool.gpu_model:
        planned |= accepting(pool, **later)
    ids = (Reservation.objects.filter(planned, gang_index=0)  # a gang moves whole
           .order_by("during__startswith", "id").values_list("id", flat=True))
    return sum(reservation_start_earlier(reservation_id=rsv_id, pool_id=pool_id) is not None
               for rsv_id in list(ids[:PLANNED_PER_PASS]))


@audited
def reservation_start_earlier(*, reservation_id: str, pool_id: str | None = None
                              ) -> Reservation | None:
    """Start a planned reservation now if it fits now, in its pool or in `pool_id` (another
    of its site whose model it accepts); None when it does not (its plan stands), or
    another worker holds it. A gang moves whole, in its own pool."""
    gang_id = gang_of_reservation(reservation_id)
    if gang_id:
        return _start_gang_earlier(gang_id, pool_id)
    rsv = (Reservation.objects.select_for_update(no_key=True, skip_locked=True)
           .filter(pk=reservation_id, state=ReservationState.PLACED, planned=True)
           .select_related("pool", "tenant").first())
    now = database_now()
    old = live_allocation(rsv) if rsv is not None else None
    if rsv is None or old is None or rsv.during is None or rsv.during.lower <= now:
        audit_exempt("nothing to move: held elsewhere, or already started")
        return None
    origin = rsv.pool_id
    target = None if pool_id in (None, origin) else Pool.objects.get(pk=pool_id)
    if target is not None:  # the quota rows it moves between, before any node's
        list(Quota.objects.select_for_update(no_key=True).filter(
            tenant_id=rsv.tenant_id, pool_id__in=[origin, target.id],
            resource=rsv.device_class).order_by("pool_id"))
    planned_start = rsv.during.lower
    # Its planned window given up and the request asked again now, in a savepoint: where
    # it does not fit now, the savepoint is rolled back and the plan stands as it was.
    point = transaction.savepoint()
    free_allocation(old, now, keep_history=False)
    rsv.state = ReservationState.PENDING
    allocation = place_now(rsv, target, now)
    if allocation is None:
        transaction.savepoint_rollback(point)
        audit_exempt("its planned start stands: it does not fit now")
        return None
    transaction.savepoint_commit(point)
    audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.start_earlier",
                 target=rsv.id, data={"nodeId": allocation.node_id,
                                      "plannedStart": instant(planned_start),
                                      **moved_from(rsv, origin)},
                 reason="GPUs freed before its planned start")
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_STARTED_EARLIER,
               subject=rsv.id, payload={"poolId": rsv.pool_id, "nodeId": allocation.node_id,
                                        "plannedStart": planned_start,
                                        "start": rsv.during.lower})
    emit_placed(rsv, allocation)
    return rsv


def _start_gang_earlier(gang_id: str, pool_id: str | None) -> Reservation | None:
    members = lock_gang(gang_id)
    leader, now = members[0], database_now()
    if pool_id not in (None, leader.pool_id) or any(
            m.state != ReservationState.PLACED or not m.planned or m.during is None
            or m.during.lower <= now for m in members):
        audit_exempt("nothing to move: the gang is not a plan to come in this pool")
        return None
    planned_start = leader.during.lower if leader.during else now
    point = transaction.savepoint()  # its plan given up only if all of it fits now
    for member in members:
        old = live_allocation(member)
        if old is not None:
            free_allocation(old, now, keep_history=False)
        member.state = ReservationState.PENDING
    allocations = gang_place(members, leader.pool, now)
    if allocations is None:
        transaction.savepoint_rollback(point)
        audit_exempt("its planned start stands: it does not fit now")
        return None
    transaction.savepoint_commit(point)
    audit_record(tenant_id=leader.tenant_id, actor_id="system",
                 action="reservation.start_earlier", target=leader.id,
                 reason="GPUs freed before its planned start",
                 data={"gangId": gang_id, "nodes": [a.node_id for a in allocations],
                       "plannedStart": instant(planned_start)})
    for member, allocation in zip(members, allocations, strict=True):
        event_emit(tenant_id=member.tenant_id, type=ReservationEvent.RESERVATION_STARTED_EARLIER,
                   subject=member.id, payload={"poolId": member.pool_id,
                                               "nodeId": allocation.node_id,
                                               "plannedStart": planned_start,
                                               "start": member.starts_at, "gangId": gang_id})
        emit_placed(member, allocation)
    return leader
