"""Booking GPUs: create a reservation, place it now or leave it pending, place pending ones.

Lock order, everywhere in the ledger: the reservation row, then the tenant's quota row,
then nodes by id, then devices by id (device rows are only locked where their own columns
change; bookings are guarded by the EXCLUDE constraint, not by locks).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from audit.services import audit_record, audited
from compute.db import constraint_errors, database_now
from compute.errors import CapacityConflict, InvalidArgument
from compute.events.services import event_emit
from compute.events.types import EventType
from compute.idempotency import idempotent_lookup, idempotent_remember
from compute.queue.work import enqueue
from compute.tenancy.models import Principal, Tenant
from fleet.models import Pool, PoolClass
from fleet.selectors import access_pool_by_id
from reservations.candidates import (
    MAX_START_AHEAD,
    device_filter_q,
    pending_reason,
    placement_request,
    propose,
    schedulable_sql,
    window,
)
from reservations.constraints import LEDGER_CONSTRAINTS
from reservations.device_filter import parse_selector
from reservations.ledger import Allocation, Reservation, ReservationState
from reservations.quotas import quota_consume
from reservations.states import transition
from reservations.work import RESERVATION

GPU = "gpu"
MAX_RACES = 8  # re-reads after losing a booking race, before leaving the request pending
PAST_START_SLACK = timedelta(minutes=1)


class NodeFull(Exception):
    """The chosen node's host counters no longer fit (another booker took them)."""


def try_place(rsv: Reservation, pool: Pool, now: datetime,
              excluded: set[str] | None = None) -> Allocation | None:
    """Book the reservation on the best node now, or return None (it stays pending).

    Runs inside the caller's transaction; each booking attempt is a savepoint, so a lost
    race (EXCLUDE violation, or host counters taken) leaves nothing behind and we re-read.
    """
    start = max(rsv.requested_start or now, now)
    during = window(start, rsv.duration_ms)
    request = placement_request(rsv)
    devices = device_filter_q(rsv)
    excluded = set(excluded or ())
    for _ in range(MAX_RACES):
        choice, candidates = propose(pool, during, request, device_filter=devices,
                                     excluded=excluded)
        if choice is None:
            rsv.failure_reason = pending_reason(pool, during, candidates, request)[:300]
            rsv.save(update_fields=["failure_reason"])
            return None
        try:
            with transaction.atomic():
                allocation = _book(rsv, choice.node_id, list(choice.device_ids), choice.vcpus,
                                   choice.memory_gib, during)
        except NodeFull:
            excluded.add(choice.node_id)
            continue
        except CapacityConflict:
            continue
        rsv.during = during
        rsv.placed_at = now
        rsv.placement_attempts += 1
        rsv.failure_reason = ""
        transition(rsv, ReservationState.PLACED)
        rsv.save(update_fields=["during", "placed_at", "state", "placement_attempts",
                                "failure_reason"])
        enqueue(RESERVATION, rsv.id, due_at=during.lower)  # a worker binds it at its start
        return allocation
    return None


# One statement books a choice: the node's host share is taken only while the node is
# schedulable and has room (the row lock orders concurrent bookers of one node), then the
# allocation and its device bookings are written; the EXCLUDE constraint referees the
# devices. No row comes back when the node no longer fits.
BOOK_SQL = """
WITH node AS (
  UPDATE fleet_node
     SET vcpus_allocated = vcpus_allocated + %(vcpus)s,
         memory_gib_allocated = memory_gib_allocated + %(memory)s
   WHERE fleet_node.id = %(node)s AND {schedulable}
     AND vcpus - vcpus_allocated >= %(vcpus)s
     AND memory_gib - memory_gib_allocated >= %(memory)s
  RETURNING id),
allocation AS (
  INSERT INTO reservations_allocation (id, reservation_id, node_id, vcpus, memory_gib,
                                       created_at)
  SELECT %(allocation)s, %(reservation)s, node.id, %(vcpus)s, %(memory)s, %(now)s FROM node
  RETURNING id)
INSERT INTO reservations_booking (allocation_id, device_id, during)
SELECT allocation.id, device, %(during)s FROM allocation, unnest(%(devices)s::text[]) device
RETURNING device_id"""


def _book(rsv: Reservation, node_id: str, device_ids: list[str], vcpus: int, memory_gib: int,
          during: Any) -> Allocation:
    schedulable, values = schedulable_sql()
    allocation = Allocation(reservation=rsv, node_id=node_id, vcpus=vcpus,
                            memory_gib=memory_gib)
    with constraint_errors(LEDGER_CONSTRAINTS), connection.cursor() as cursor:
        cursor.execute(BOOK_SQL.replace("{schedulable}", schedulable), {
            **values, "node": node_id, "vcpus": vcpus, "memory": memory_gib,
            "allocation": allocation.id, "reservation": rsv.id, "now": allocation.created_at,
            "during": during, "devices": sorted(device_ids)})
        if cursor.rowcount != len(device_ids):
            raise NodeFull(node_id)
    allocation._state.adding = False  # written above
    return allocation


def later_start(now: datetime, start: datetime | None, start_in_ms: int | None
                ) -> datetime | None:
    """A request's start from `start` or `startIn` (ms from now), None for now; refused when
    in the past or beyond the horizon."""
    if start is not None and start_in_ms is not None:
        raise InvalidArgument("give start or startIn, not both", field="startIn")
    if start_in_ms:
        return now + timedelta(milliseconds=start_in_ms)
    if start is None:
        return None
    if start < now - PAST_START_SLACK:
        raise InvalidArgument(f"start: {start.isoformat()} is in the past", field="start")
    if start > now + MAX_START_AHEAD:
        raise InvalidArgument(f"start: at most {MAX_START_AHEAD.days} days ahead",
                              field="start")
    return start if start > now else None


def emit_placed(rsv: Reservation, allocation: Allocation) -> None:
    payload = {"poolId": rsv.pool_id, "nodeId": allocation.node_id, "gpus": rsv.gpu_count,
               "allocationId": allocation.id, "start": rsv.starts_at, "end": rsv.ends_at}
    event_emit(tenant_id=rsv.tenant_id, type=EventType.RESERVATION_PLACED, subject=rsv.id,
               payload=payload)


def _check_request(pool: Pool, *, model: str, kubernetes: bool, topology: str) -> None:
    if pool.pool_class != PoolClass.METAL_HOST:
        raise InvalidArgument(f"poolId: pool {pool.id} is a {pool.pool_class} pool; GPUs are "
                              "reserved from metal-host pools", field="poolId")
    if model and model.upper() != pool.gpu_model.upper():
        raise InvalidArgument(f"model: pool {pool.id} holds {pool.gpu_model} GPUs, not {model}",
                              field="model")
    if kubernetes and not pool.policy.get("kubernetes"):
        raise InvalidArgument(f"kubernetes: pool {pool.id} does not allow Kubernetes workers",
                              field="kubernetes")
    if topology not in ("any", "nvlink-all"):
        raise InvalidArgument(f"topology: {topology!r} is not any or nvlink-all",
                              field="devices")


@audited
def reservation_create(*, tenant: Tenant, actor: Principal, pool_id: str, gpus: int,
                       duration_ms: int, topology: str = "any", start: datetime | None = None,
                       start_in_ms: int | None = None, model: str = "", product: str = "",
                       selector: str = "", kubernetes: bool = False,
                       idempotency_key: str | None = None) -> Reservation:
    """Reserve `gpus` GPUs of one pool for `duration_ms`, now or from a later start.

    Quota is consumed here, whether the reservation is placed now or left pending; a
    request that fits nowhere is stored as pending and placed when capacity frees.
    """
    inputs = {"pool_id": pool_id, "gpus": gpus, "duration_ms": duration_ms,
              "topology": topology, "start": start, "start_in_ms": start_in_ms,
              "model": model, "product": product, "selector": selector,
              "kubernetes": kubernetes}
    existing = idempotent_lookup(tenant_id=tenant.id, scope="reservations.create",
                                 key=idempotency_key, inputs=inputs)
    if existing:
        return Reservation.objects.get(pk=existing)
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id)
    _check_request(pool, model=model, kubernetes=kubernetes, topology=topology)
    parse_selector(selector)
    now = database_now()
    requested_start = None
    requested_start = later_start(now, start, start_in_ms)
    quota_consume(tenant=tenant, pool=pool, resource=GPU, amount=gpus)
    rsv = Reservation.objects.create(
        tenant=tenant, pool=pool, gpu_count=gpus, topology=topology, model=model,
        product=product, selector=selector, kubernetes=kubernetes,
        requested_start=requested_start, duration_ms=duration_ms)
    allocation = try_place(rsv, pool, now)
    idempotent_remember(tenant_id=tenant.id, scope="reservations.create", key=idempotency_key,
                        inputs=inputs, object_id=rsv.id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="reservation.create",
                 target=rsv.id, data={"poolId": pool.id, "gpus": gpus,
                                      "durationMs": duration_ms, "placed": bool(allocation)})
    if allocation is None:
        event_emit(tenant_id=tenant.id, type=EventType.RESERVATION_PENDING, subject=rsv.id,
                   payload={"poolId": pool.id, "gpus": gpus})
    else:
        emit_placed(rsv, allocation)
    return rsv


@audited
def reservation_place_pending(*, reservation_id: str) -> Reservation | None:
    """Try to place one pending reservation; None if another worker holds it."""
    rsv = (Reservation.objects.select_for_update(skip_locked=True)
           .filter(pk=reservation_id, state=ReservationState.PENDING).first())
    if rsv is None:
        return None
    pool = Pool.objects.get(pk=rsv.pool_id)
    allocation = try_place(rsv, pool, database_now())
    if allocation is not None:
        audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.place",
                     target=rsv.id, data={"nodeId": allocation.node_id}, reason="capacity freed")
        emit_placed(rsv, allocation)
    return rsv


def pending_place(*, pool_id: str, limit: int = 100) -> int:
    """Retry the pool's pending reservations in creation order; returns how many were placed.

    Each attempt is its own transaction, so one that cannot fit never holds back the others.
    """
    pending = list(Reservation.objects.filter(pool_id=pool_id, state=ReservationState.PENDING)
                   .order_by("created_at", "id").values_list("id", flat=True)[:limit])
    placed = 0
    for reservation_id in pending:
        rsv = reservation_place_pending(reservation_id=reservation_id)
        if rsv is not None and rsv.state == ReservationState.PLACED:
            placed += 1
    return placed
