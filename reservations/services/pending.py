"""Waiting requests offered capacity as it frees: in their own pool, and in the other pools
of their site whose GPU model they accept (`models` when they were asked).

A request that moves to another pool takes its quota with it (given back on its own pool,
taken on the new one, under the quota rows' locks before any node's, as booking takes
them), and is checked there as a new request would be: the pool serves its shape, the
offering's limits allow it, its priority class is granted there. All of it happens in a
savepoint that is rolled back when it does not fit there either.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import transaction

from audit.services import audit_exempt, audit_record, audited
from compute.core.db import database_now
from compute.core.errors import ComputeError
from fleet.models import Pool
from reservations.limits import check_request, offering_limits
from reservations.models import Allocation, Reservation, ReservationState
from reservations.quotas import quota_consume, quota_refund
from reservations.services.book import check_atoms, check_pool_request, emit_placed, try_place
from reservations.services.gang import gang_of_reservation, gang_place, lock_gang
from reservations.shape import Shape
from reservations.sharing import granted_classes, pending_queue


def _may_move(rsv: Reservation, target: Pool, now: datetime) -> bool:
    """`target` would take the request as it was asked."""
    shape = Shape.of(rsv)
    if shape.device_class == "gpu-share" and \
            target.shares_per_gpu != rsv.pool.shares_per_gpu:
        return False  # its count is in its own pool's shares
    try:
        check_pool_request(target, shape)
        check_atoms(target, shape)
        check_request(offering_limits(rsv.tenant_id, target), duration_ms=rsv.duration_ms,
                      start=rsv.requested_start, now=now)
    except ComputeError:
        return False
    return rsv.priority_class in granted_classes(rsv.tenant_id, target)


Place = Callable[[Reservation, Pool, datetime], Allocation | None]


def place_in(rsv: Reservation, target: Pool, now: datetime,
             place: Place = try_place) -> Allocation | None:
    """Inside the caller's transaction: place a waiting request (pending, or a planned one
    whose plan was just given up) in `target`, another pool of its site, moving its quota;
    None, with nothing changed, when it may not or does not fit there. `place` books it
    there: now (`try_place`), or at its earliest window."""
    if not _may_move(rsv, target, now):
        return None
    origin = rsv.pool
    point = transaction.savepoint()
    try:
        if not rsv.borrowed:  # a borrowed one consumed none
            quota_refund(tenant_id=rsv.tenant_id, pool=origin, resource=rsv.device_class,
                         count=rsv.count)
            quota_consume(tenant=rsv.tenant, pool=target, resource=rsv.device_class,
                          count=rsv.count)
        rsv.pool = target
        allocation = place(rsv, target, now)
    except ComputeError:
        allocation = None
    if allocation is None:
        transaction.savepoint_rollback(point)
        rsv.pool = origin
        return None
    rsv.save(update_fields=["pool"])
    transaction.savepoint_commit(point)
    return allocation


def place_now(rsv: Reservation, target: Pool | None, now: datetime) -> Allocation | None:
    """Inside the caller's transaction: place a waiting request now in its own pool, or in
    `target` (another of its site), moving its quota; None when it does not fit."""
    return try_place(rsv, rsv.pool, now) if target is None else place_in(rsv, target, now)


def moved_from(rsv: Reservation, origin: str) -> dict[str, str]:
    """An audit row's note of a request placed in another pool than `origin`, its own."""
    return {"fromPool": origin, "poolId": rsv.pool_id} if rsv.pool_id != origin else {}


@audited
def reservation_place_pending(*, reservation_id: str, pool_id: str | None = None
                              ) -> Reservation | None:
    """Try to place one pending reservation, in its own pool or in `pool_id` (another of
    its site whose model it accepts); None if another worker holds it. A gang is placed
    whole, in its own pool."""
    gang_id = gang_of_reservation(reservation_id)
    if gang_id:
        return _place_pending_gang(gang_id, pool_id)
    rsv = (Reservation.objects.select_for_update(no_key=True, skip_locked=True)
           .filter(pk=reservation_id, state=ReservationState.PENDING)
           .select_related("pool", "tenant").first())
    if rsv is None:
        return None
    now = database_now()
    origin = rsv.pool_id
    target = None if pool_id in (None, origin) else Pool.objects.get(pk=pool_id)
    allocation = place_now(rsv, target, now)
    if allocation is not None:
        moved = moved_from(rsv, origin)
        audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.place",
                     target=rsv.id, data={"nodeId": allocation.node_id, **moved},
                     reason="capacity freed")
        emit_placed(rsv, allocation)
    else:
        audit_exempt("still pending: only its reason for waiting was written")
    return rsv


def _place_pending_gang(gang_id: str, pool_id: str | None) -> Reservation | None:
    members = lock_gang(gang_id)
    leader = members[0]
    if pool_id not in (None, leader.pool_id) or any(
            m.state != ReservationState.PENDING for m in members):
        audit_exempt("a gang is placed in its own pool, and only while all of it waits")
        return None
    allocations = gang_place(members, leader.pool, database_now())
    if allocations is None:
        audit_exempt("still pending: only its reason for waiting was written")
        return leader
    audit_record(tenant_id=leader.tenant_id, actor_id="system", action="reservation.place",
                 target=leader.id, reason="capacity freed",
                 data={"gangId": gang_id, "nodes": [a.node_id for a in allocations]})
    for member, allocation in zip(members, allocations, strict=True):
        emit_placed(member, allocation)
    return leader


def pending_place(*, pool_id: str, limit: int = 100) -> int:
    """Offer the pool's capacity to the requests waiting for it in the queue's order
    (priority, fair share, age: reservations.sharing), its own and those of other pools
    that accept its model; returns how many were placed.

    Each attempt is its own transaction, so one that cannot fit never holds back the others.
    """
    pool = Pool.objects.get(pk=pool_id)
    placed = 0
    for queued in pending_queue(pool, database_now(), movable=True)[:limit]:
        rsv = reservation_place_pending(reservation_id=queued.reservation_id, pool_id=pool_id)
        if rsv is not None and rsv.state == ReservationState.PLACED:
            placed += 1
    return placed
