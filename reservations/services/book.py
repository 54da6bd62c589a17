"""Booking GPUs: create a reservation, place it now or leave it pending, place pending ones.

Lock order, everywhere in the ledger: the reservation row, then the tenant's quota row,
then nodes by id, then devices by id (device rows are only locked where their own columns
change; bookings are guarded by the EXCLUDE constraint, not by locks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import transaction

from audit.services import audit_record, audited
from compute.core.db import (
    database_now,
    insert_row,
    known_related,
)
from compute.core.errors import CapacityConflict, InvalidArgument, NeverFits, QuotaExceeded
from compute.platform.idempotency import idempotent_lookup, idempotent_remember
from compute.platform.queue.work import enqueue
from compute.platform.tenancy.models import Principal, Tenant
from fleet.models import DeviceClass, Pool, PoolClass
from fleet.selectors import access_pool_by_id, pool_list
from reservations.budgets import check_budgets
from reservations.candidates import (
    device_filter_q,
    end_by,
    later_start,
    never_fits,
    pending_reason,
    placement_request,
    propose,
    window,
)
from reservations.device_filter import parse_selector
from reservations.earliest import search_for
from reservations.limits import (
    check_at_once,
    check_request,
    offering_limits,
)
from reservations.models import (
    Allocation,
    Reservation,
    ReservationSeries,
    ReservationState,
    Topology,
)
from reservations.quotas import quota_allows, quota_consume
from reservations.services.booking import (
    MAX_RACES,
    NodeFull,
    book_on_node,
    emit_pending,
    emit_placed,
    hold_node,
)
from reservations.services.gang import book_gang, check_gang_could_fit, check_gang_request
from reservations.services.holds import bind_hold
from reservations.shape import Ask, Shape
from reservations.sharing import (
    DEFAULT_CLASS,
    PriorityClass,
    pool_classes,
    priority_class_for,
)
from reservations.states import transition
from reservations.work import RESERVATION, pool_replan

GPU = DeviceClass.GPU.value


def try_place(rsv: Reservation, pool: Pool, now: datetime,
              excluded: set[str] | None = None, *, queue_start: bool = True) -> Allocation | None:
    """Book the reservation on the best node now, or return None (it stays pending). A
    worker binds it at its start (unless `queue_start` is off: the caller sees to it).

    Runs inside the caller's transaction; each booking attempt is a savepoint, so a lost
    race (EXCLUDE violation, or host counters taken) leaves nothing behind and we re-read.
    """
    start = max(rsv.requested_start or now, now)
    during = window(start, rsv.duration_ms)
    shape = Shape.of(rsv)
    request = placement_request(pool, shape)
    devices = device_filter_q(shape)
    excluded = set(excluded or ())
    for _ in range(MAX_RACES):
        choice, candidates = propose(pool, during, request, device_filter=devices,
                                     excluded=excluded)
        if choice is None:
            rsv.failure_reason = pending_reason(pool, during, candidates, request,
                                                devices)[:300]
            rsv.save(update_fields=["failure_reason"])
            return None
        try:
            with transaction.atomic():
                choice = hold_node(candidates, request)
                allocation = book_on_node(rsv, choice, during, placed_at=now)
        except NodeFull:  # of the node held, or of the one waited for
            excluded.add(choice.node_id)
            continue
        except CapacityConflict:
            continue
        rsv.during = during  # as the booking statement wrote them
        rsv.placed_at = now
        rsv.placement_attempts += 1
        rsv.failure_reason = ""
        transition(rsv, ReservationState.PLACED)
        if queue_start:
            enqueue(RESERVATION, rsv.id, due_at=during.lower)
        return allocation
    return None


def check_pool_request(pool: Pool, shape: Shape) -> None:
    """The pool can serve the shape: a GPU pool, its model, Kubernetes if asked."""
    model, kubernetes, topology = shape.model, shape.kubernetes, shape.topology
    if pool.pool_class != PoolClass.METAL_HOST:
        raise InvalidArgument(f"poolId: pool {pool.id} is a {pool.pool_class} pool; GPUs are "
                              "reserved from metal-host pools", field="poolId")
    if model and model.upper() != pool.gpu_model.upper():
        raise InvalidArgument(f"model: pool {pool.id} holds {pool.gpu_model} GPUs, not {model}",
                              field="model")
    if kubernetes and not pool.policy.get("kubernetes"):
        raise InvalidArgument(f"kubernetes: pool {pool.id} does not allow Kubernetes workers",
                              field="kubernetes")
    if shape.slurm_account and not pool.policy.get("slurm"):
        raise InvalidArgument(f"slurm: pool {pool.id} publishes no holds to Slurm (its policy "
                              "names no slurm cluster)", field="slurm")
    if topology not in Topology.values:
        raise InvalidArgument(f"topology: {topology!r} is not one of "
                              f"{', '.join(Topology.values)}", field="devices")


def check_atoms(pool: Pool, shape: Shape) -> None:
    """A request for MIG instances names their profile; one for shares needs a pool that
    slices its GPUs, and asks for them anywhere or all of one GPU (`same-gpu`, at most the
    pool's shares per GPU); only whole GPUs ask for NVLink."""
    device_class, profile, topology = shape.device_class, shape.profile, shape.topology
    one_gpu = device_class == DeviceClass.SHARE and topology == Topology.SAME_GPU
    if device_class != GPU and topology != "any" and not one_gpu:
        raise InvalidArgument(f"devices[0].topology: {device_class} atoms are not NVLinked; "
                              "ask for topology any"
                              + (" or same-gpu" if device_class == DeviceClass.SHARE else ""),
                              field="devices")
    if device_class == GPU and topology == Topology.SAME_GPU:
        raise InvalidArgument("devices[0].topology: same-gpu is for gpu-share requests (the "
                              "shares of one GPU)", field="devices")
    if device_class == DeviceClass.MIG and not profile:
        raise InvalidArgument("devices[0].profile: a mig request names its profile, such as "
                              "1g.10gb", field="devices")
    if device_class != DeviceClass.MIG and profile:
        raise InvalidArgument("devices[0].profile: only mig requests have a profile",
                              field="devices")
    if device_class == DeviceClass.SHARE and not pool.shares_per_gpu:
        raise InvalidArgument(f"devices[0].class: pool {pool.id} does not slice its GPUs "
                              "(policy.timeSlicing)", field="devices")
    if one_gpu and shape.count > pool.shares_per_gpu:
        raise InvalidArgument(f"devices[0].count: pool {pool.id} slices each GPU into "
                              f"{pool.shares_per_gpu} shares; {shape.count} cannot be of one GPU",
                              field="devices")


def check_could_fit(pool: Pool, shape: Shape) -> None:
    """Refuse at once what no machine of the pool could ever hold (`never_fits`): waiting
    pending is for what frees."""
    reason = never_fits(pool, placement_request(pool, shape), device_filter_q(shape))
    if reason is not None:
        raise NeverFits(reason, poolId=pool.id)


def check_fraction(shape: Shape) -> None:
    """A fraction of a GPU is asked of gpu-share, instead of a count."""
    if not shape.fraction:
        return
    if shape.device_class != DeviceClass.SHARE:
        raise InvalidArgument("devices[0].fraction: only gpu-share requests ask for a "
                              "fraction of a GPU", field="devices")
    if shape.count != 1:
        raise InvalidArgument("devices[0].fraction: give a count or a fraction, not both",
                              field="devices")


@audited
def reservation_create(*, tenant: Tenant, actor: Principal, pool_id: str, shape: Shape,
                       duration_ms: int, start: datetime | None = None,
                       start_in_ms: int | None = None, at_earliest: bool = False,
                       before: datetime | None = None, before_in_ms: int | None = None,
                       idempotency_key: str | None = None, pool: Pool | None = None,
                       priority_class: str = DEFAULT_CLASS,
                       models: Sequence[str] = (), nodes: int = 1) -> Reservation:
    """Reserve `shape` (so many GPUs, MIG instances of a profile, or time-sliced shares) of
    one pool for `duration_ms`, now or from a later start.

    Quota is consumed here, whether the reservation is placed now or left pending; a
    request that fits nowhere is stored as pending and placed when capacity frees. With
    `at_earliest`, it is booked in the earliest window from its start (ending by `before`)
    where it fits, or refused when there is none. `pool` is `pool_id`'s row when the caller
    has already found it within the tenant's reach (the API's draft does). Its
    `priority_class` is one the tenant may use on the pool (reservations.sharing). With
    `models`, the tenant's GPU pools of the same site with one of those models are
    candidates too, and the request is booked in the best of them (`best_pool`). With
    `nodes` above 1, it is a gang (reservations.services.gang): that many nodes, each with
    `shape`, booked together; the reservation returned is its member 0.
    """
    inputs = {"pool_id": pool_id, **shape.inputs(), "duration_ms": duration_ms,
              "start": start, "start_in_ms": start_in_ms, "at_earliest": at_earliest,
              "before": before, "before_in_ms": before_in_ms,
              **({"priority_class": priority_class} if priority_class != DEFAULT_CLASS else {}),
              **({"models": sorted(models)} if models else {}),
              **({"nodes": nodes} if nodes != 1 else {})}
    existing = idempotent_lookup(tenant_id=tenant.id, scope="reservations.create",
                                 key=idempotency_key, inputs=inputs)
    if existing:
        return Reservation.objects.get(pk=existing)
    if pool is None or pool.pk != pool_id:
        pool = access_pool_by_id(tenant=tenant, pool_id=pool_id)
    now = database_now()
    before = end_by(now, before, before_in_ms)
    if before is not None and not at_earliest:
        raise InvalidArgument("before: only with atEarliest", field="before")
    requested_start = later_start(now, start, start_in_ms)
    check_fraction(shape)
    if nodes != 1:
        check_gang_request(shape, nodes, models=models)
    if models:
        pool = best_pool(tenant, pool, shape, models,
                         window(requested_start or now, duration_ms))
    shape = shape.on(pool)
    check_pool_request(pool, shape)
    check_atoms(pool, shape)
    parse_selector(shape.selector)
    priority = priority_class_for(tenant.id, pool, priority_class)
    allocation: Allocation | None
    if nodes != 1:
        members, allocations = book_gang(
            tenant=tenant, pool=pool, now=now, shape=shape, nodes=nodes,
            requested_start=requested_start, duration_ms=duration_ms, priority=priority,
            at_earliest=at_earliest, before=before)
        rsv, allocation = members[0], allocations[0] if allocations else None
        if allocations is None:
            check_gang_could_fit(pool, shape, nodes)
    else:
        rsv, allocation = book_new(
            tenant=tenant, pool=pool, now=now, shape=shape, requested_start=requested_start,
            duration_ms=duration_ms, at_earliest=at_earliest, before=before,
            priority=priority, models=models, bind_at_start=True)
    if allocation is None:  # about to wait: only for what some machine could hold
        check_could_fit(pool, shape)  # (refused, the transaction writes nothing)
    idempotent_remember(tenant_id=tenant.id, scope="reservations.create", key=idempotency_key,
                        inputs=inputs, object_id=rsv.id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="reservation.create",
                 target=rsv.id, data={"poolId": pool.id, "gpus": shape.count,
                                      "class": shape.device_class, "durationMs": duration_ms,
                                      "priorityClass": priority.name,
                                      "placed": bool(allocation),
                                      **({"binding": {"nodeId": allocation.node_id,
                                                      "allocationId": allocation.id}}
                                         if allocation and rsv.state == ReservationState.BINDING
                                         else {}),
                                      **({"nodes": nodes, "gangId": rsv.gang_id}
                                         if rsv.gang_id else {})})
    return rsv


def best_pool(tenant: Tenant, pool: Pool, shape: Shape, models: Sequence[str],
              during: Any) -> Pool:
    """Among `pool` and the tenant's other GPU pools of its site with one of `models`, the
    one where the placer's best choice for `shape` scores best over `during`, leaving out
    those whose quota or policy would refuse it; `pool` itself when it fits in none now
    (the request then waits there)."""
    wanted = {model.upper() for model in models}
    others = (pool_list(tenant=tenant).filter(site_id=pool.site_id,
                                              pool_class=PoolClass.METAL_HOST)
              .exclude(pk=pool.pk).order_by("id"))
    best: tuple[Any, Pool] | None = None
    for candidate in [pool, *(p for p in others if p.gpu_model.upper() in wanted)]:
        shape_there = shape.on(candidate)
        try:
            check_pool_request(candidate, shape_there)
            check_atoms(candidate, shape_there)
        except InvalidArgument:
            continue
        if not quota_allows(tenant=tenant, pool=candidate, resource=shape_there.device_class,
                            count=shape_there.count):
            continue
        choice, _ = propose(candidate, during, placement_request(candidate, shape_there),
                            device_filter=device_filter_q(shape_there))
        if choice is not None and (best is None or choice.score < best[0]):
            best = (choice.score, candidate)
    return best[1] if best else pool


def book_new(*, tenant: Tenant, pool: Pool, now: datetime, shape: Shape,
             requested_start: datetime | None, duration_ms: int, at_earliest: bool = False,
             before: datetime | None = None, series: ReservationSeries | None = None,
             priority: PriorityClass | None = None, models: Sequence[str] = (),
             bind_at_start: bool = False) -> tuple[Reservation, Allocation | None]:
    """A new reservation of a checked request, inside the caller's service: the offering's
    limits, the quota, placement (now, or at the earliest window) or pending, and its
    placed or pending event. With `bind_at_start`, one whose window starts now is bound in
    the same transaction (`reservation_create`: no worker's turn between the call and the
    node's spec). Refusals raise and leave nothing."""
    limits = offering_limits(tenant.id, pool)
    check_request(limits, duration_ms=duration_ms, start=requested_start, now=now)
    priority = priority or pool_classes(pool)[DEFAULT_CLASS]
    borrowed = False
    try:
        quota_consume(tenant=tenant, pool=pool, resource=shape.device_class, count=shape.count)
    except QuotaExceeded:
        if not priority.preemptible or at_earliest or requested_start is not None:
            raise
        borrowed = True  # over quota, while GPUs are free: preempted for any within quota
    rsv = Reservation(tenant=tenant, pool=pool, requested_start=requested_start,
                      duration_ms=duration_ms, series=series, priority_class=priority.name,
                      priority=priority.weight, borrowed=borrowed,
                      gpu_models=sorted({model.upper() for model in models}), **shape.columns())
    insert_row(rsv)
    if at_earliest:
        allocation: Allocation | None = place_at_earliest(rsv, pool, now, before,
                                                          queue_start=not bind_at_start)
    else:
        allocation = try_place(rsv, pool, now, queue_start=not bind_at_start)
    if borrowed and allocation is None:
        raise QuotaExceeded(f"{shape.device_class} quota on pool {pool.id} exceeded, and a "
                            "preemptible request borrows only what is free now: none fits",
                            resource=shape.device_class, borrowing=True)
    if shape.device_class == GPU:  # under the quota row's lock (taken above), over its window
        during = rsv.during or window(rsv.requested_start or now, duration_ms)
        check_at_once(limits, tenant_id=tenant.id, pool=pool, gpus=shape.count, skip=rsv.id,
                      during=during)
        check_budgets(limits, tenant_id=tenant.id, pool=pool, gpus=shape.count, skip=rsv.id,
                      during=during, priority_class=priority.name)
    known_related(rsv, "allocations", [allocation] if allocation else [])  # a new one's all
    if allocation is None:
        pool_replan(pool.id)  # a worker sees whether it may preempt what it needs
        emit_pending(rsv)
    else:
        emit_placed(rsv, allocation)
        if bind_at_start:
            bind_or_queue(rsv, allocation, now)
    return rsv, allocation


def bind_or_queue(rsv: Reservation, allocation: Allocation, now: datetime) -> None:
    """Bind a placed reservation whose window has started, in the caller's transaction;
    queue the worker's bind for one that starts later, or whose GPUs are still in the
    node's spec for what ended there (the worker releases that first)."""
    start = rsv.starts_at or now  # placed: its window's start
    if start > now or bind_hold(rsv, allocation, now) is None:
        enqueue(RESERVATION, rsv.id, due_at=start)


def place_at_earliest(rsv: Reservation, pool: Pool, now: datetime,
                      before: datetime | None, *, queue_start: bool = True) -> Allocation:
    """Book `rsv` in the earliest window where it fits; when another booker takes that
    window first, the next one. Refused (the caller's transaction rolls back) when no
    window is left before the horizon or `before`."""
    search = search_for(Ask.of(rsv), now, rsv.requested_start, before)
    for _ in range(MAX_RACES):
        slot = search.slot()
        if slot is None:
            break
        start = slot.during.lower
        rsv.requested_start = start if start > now else None
        rsv.save(update_fields=["requested_start"])
        allocation = try_place(rsv, pool, now, queue_start=queue_start)
        if allocation is not None:
            return allocation
        search = replace(search, after=start)
    raise CapacityConflict(f"no earliest slot: {search.reason()}")
