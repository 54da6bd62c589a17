"""Preemption: a pending request takes GPUs back from preemptible reservations, after notice.

A reservation of a preemptible class may be preempted for a pending request of a higher
priority, or, when it was placed over its tenant's quota (borrowed), for any request within
quota. Never a reservation of another class, and never for a request that would not then
fit: the victims are the fewest reservations, newest first, on one node, whose release lets
the placer itself fit the request there (asked with their allocations ended inside a
savepoint that is rolled back).

Each victim is told (`reservation.preempting`, with the deadline of the pool's notice
period, and a notice file beside its hold's env file on the node) and released at the
deadline with the cause `preempted`, the request placed in the same transaction (so nothing
booked meanwhile takes what was freed for it); unless the request no longer waits for it
(placed elsewhere, or withdrawn): then the preemption is withdrawn.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from audit.services import audit_exempt, audit_record, audited
from compute.core.db import database_now
from compute.platform.events.services import event_emit
from compute.platform.queue.work import enqueue
from fleet.models import Node, Pool
from fleet.services.specs import node_spec_change_locked
from reservations.candidates import device_filter_q, placement_request, propose, window
from reservations.events import ReservationEvent
from reservations.hostshare import host_counters_refresh, node_lock
from reservations.models import Allocation, Booking, Reservation, ReservationState
from reservations.services.book import emit_placed, try_place
from reservations.services.gang import gang_of_reservation, gang_place, lock_gang, propose_gang
from reservations.services.holds import hold_of
from reservations.services.release import end_reservation
from reservations.shape import Shape
from reservations.sharing import notice_seconds, pending_queue, pool_classes
from reservations.states import HOLDING
from reservations.work import RESERVATION

MAX_VICTIMS = 8  # reservations preempted at most for one request
QUEUE_LOOK = 10  # pending requests, from the head of the queue, that may preempt


def may_preempt(requester: Reservation, victim: Reservation, pool: Pool) -> bool:
    if victim.gang_id:  # a gang holds its nodes together: none of them is taken back
        return False
    victim_class = pool_classes(pool).get(victim.priority_class)
    if victim_class is None or not victim_class.preemptible:
        return False
    return victim.priority < requester.priority or (victim.borrowed and not requester.borrowed)


def _fits_without(rsv: Reservation, pool: Pool, allocations: list[Allocation],
                  now: datetime) -> bool:
    """Whether the placer fits `rsv` on the allocations' node once they have ended."""
    node_id = allocations[0].node_id
    shape = Shape.of(rsv)
    during = window(max(rsv.requested_start or now, now), rsv.duration_ms)
    point = transaction.savepoint()
    try:
        ids = [a.id for a in allocations]
        node_lock(node_id)  # before its bookings, as bookers take it
        Booking.objects.filter(allocation_id__in=ids).delete()
        Allocation.objects.filter(pk__in=ids).update(ended_at=now)
        host_counters_refresh(node_id)
        choice, _ = propose(pool, during, placement_request(pool, shape),
                            device_filter=device_filter_q(shape), only=[node_id],
                            whole_pool=False)
        return choice is not None
    finally:
        transaction.savepoint_rollback(point)


def placed(allocation: Allocation) -> datetime:
    return allocation.reservation.placed_at or allocation.created_at


def _preemptible_by_node(rsv: Reservation, pool: Pool, now: datetime
                         ) -> dict[str, list[Allocation]]:
    """What `rsv` may preempt in its window, by node, newest first."""
    during = window(max(rsv.requested_start or now, now), rsv.duration_ms)
    live = (Allocation.objects.select_related("reservation")
            .filter(ended_at__isnull=True, reservation__pool=pool,
                    reservation__state__in=HOLDING, reservation__preempt_at__isnull=True,
                    reservation__during__overlap=during)
            .order_by("-reservation__placed_at", "-reservation_id"))
    by_node: dict[str, list[Allocation]] = {}
    for allocation in live:
        if may_preempt(rsv, allocation.reservation, pool):
            by_node.setdefault(allocation.node_id, []).append(allocation)
    return by_node


def _fewest_on(rsv: Reservation, pool: Pool, allocations: list[Allocation], now: datetime,
               most: int) -> list[Allocation]:
    """The fewest of one node's `allocations` (at most `most`), newest first, whose release
    makes `rsv` fit there; none when no such set exists."""
    allocations = allocations[:MAX_VICTIMS * 2]
    # One victim, newest first; else the newest two, three, ... together.
    tries = [[a] for a in allocations] + [allocations[:size] for size in
                                          range(2, min(len(allocations), most) + 1)]
    for victims in tries:
        if len(victims) > most:
            break
        if _fits_without(rsv, pool, victims, now):
            return victims
    return []


def preemption_victims(rsv: Reservation, pool: Pool, now: datetime) -> list[Reservation]:
    """The fewest reservations, newest first, on one node, whose release makes `rsv` fit
    (the newer set when two nodes need as many); none when no such set exists. For a
    gang's member 0: `gang_victims`."""
    if rsv.gang_id:
        return gang_victims(rsv, pool, now)
    best: list[Allocation] = []
    for allocations in _preemptible_by_node(rsv, pool, now).values():
        victims = _fewest_on(rsv, pool, allocations, now, len(best) or MAX_VICTIMS)
        if victims and (not best or len(victims) < len(best)
                        or placed(victims[0]) > placed(best[0])):
            best = victims
    return [allocation.reservation for allocation in best]


def gang_victims(leader: Reservation, pool: Pool, now: datetime) -> list[Reservation]:
    """What a waiting gang (its member 0) needs preempted: on as many nodes as it lacks,
    the nodes needing the fewest victims each (newest first); none when the gang would
    not then fit, or fits without."""
    shape = Shape.of(leader)
    during = window(max(leader.requested_start or now, now), leader.duration_ms)
    nodes = leader.gang.nodes if leader.gang else 1
    _choice, fitting = propose_gang(pool, during, shape, nodes)
    lacking = nodes - len(fitting)
    if lacking <= 0:
        return []  # it fits (or waits for its host share): nothing to take back
    costs = sorted(((victims, node_id) for node_id, allocations in
                    _preemptible_by_node(leader, pool, now).items() if node_id not in fitting
                    if (victims := _fewest_on(leader, pool, allocations, now, MAX_VICTIMS))),
                   key=lambda pair: (len(pair[0]), -placed(pair[0][0]).timestamp()))
    if len(costs) < lacking:
        return []
    return [a.reservation for victims, _ in costs[:lacking] for a in victims]


def makes_room(rsv: Reservation, pool: Pool, now: datetime) -> bool:
    """Room is being made for `rsv` by preemption, or preempting would make it fit now: it
    waits for that, not for a later window (reservations.services.backfill)."""
    if Reservation.objects.filter(preempted_for=rsv.id, state__in=HOLDING).exists():
        return True
    preemptible = [name for name, c in pool_classes(pool).items() if c.preemptible]
    if not Reservation.objects.filter(pool=pool, state__in=HOLDING, preempt_at__isnull=True,
                                      priority_class__in=preemptible).exists():
        return False
    return bool(preemption_victims(rsv, pool, now))


def _tell_the_node(victim: Reservation) -> None:
    """A bound hold's spec carries its deadline (or no longer does): the node writes (or
    removes) the notice."""
    if victim.state not in (ReservationState.BINDING, ReservationState.ACTIVE):
        return
    allocation = victim.allocations.get(ended_at__isnull=True)
    node = Node.objects.select_for_update(no_key=True).get(pk=allocation.node_id)
    node_spec_change_locked(node, add=hold_of(allocation, victim).wire())


@audited
def reservation_preempt_for(*, reservation_id: str) -> list[Reservation]:
    """Preempt what a pending request needs, if it may and would then fit; the victims. A
    gang (its member 0) preempts on as many nodes as it lacks."""
    gang_id = gang_of_reservation(reservation_id)
    waiting = (lock_gang(gang_id) if gang_id else list(
        Reservation.objects.select_for_update(no_key=True, skip_locked=True)
        .select_related("pool").filter(pk=reservation_id)))
    rsv = waiting[0] if waiting and all(m.state == ReservationState.PENDING
                                        for m in waiting) else None
    if rsv is None or Reservation.objects.filter(preempted_for=reservation_id,
                                                 state__in=HOLDING).exists():
        audit_exempt("no request to make room for, or room is being made")
        return []
    pool, now = rsv.pool, database_now()
    victims = preemption_victims(rsv, pool, now)
    if not victims:
        audit_exempt("nothing may be preempted that would make the request fit")
        return []
    deadline = now + timedelta(seconds=notice_seconds(pool))
    locked = list(Reservation.objects.select_for_update(no_key=True)
                  .filter(pk__in=[v.id for v in victims], state__in=HOLDING,
                          preempt_at__isnull=True).order_by("id"))
    if len(locked) != len(victims):  # one ended or was chosen meanwhile: look again later
        audit_exempt("the reservations chosen changed while they were locked")
        return []
    for victim in locked:
        victim.preempt_at, victim.preempted_for = deadline, rsv.id
        victim.save(update_fields=["preempt_at", "preempted_for"])
        _tell_the_node(victim)
        enqueue(RESERVATION, victim.id, due_at=deadline)
        event_emit(tenant_id=victim.tenant_id, type=ReservationEvent.RESERVATION_PREEMPTING,
                   subject=victim.id, payload={
                       "poolId": pool.id, "preemptAt": deadline,
                       "forPriorityClass": rsv.priority_class,
                       "reason": "borrowed over quota" if victim.borrowed and not rsv.borrowed
                       else "a request of a higher priority"})
    audit_record(tenant_id=pool.tenant_id, actor_id="system", action="reservation.preempt",
                 target=rsv.id, data={"victims": [v.id for v in locked],
                                      "preemptAt": deadline.isoformat()},
                 reason="pending request of a higher priority or within quota")
    return locked


@audited
def reservation_preempted_release(*, reservation_id: str) -> list[Reservation]:
    """At its deadline, release a preempted reservation, with every other one preempted for
    the same request whose deadline has passed (so that nothing smaller takes the GPUs the
    first frees before the last is free), with the cause `preempted`; or, if the request no
    longer waits, withdraw their preemption. One audit row on the pool owner's trail, as
    for the preemption."""
    now = database_now()
    victim = (Reservation.objects.select_related("pool")
              .filter(pk=reservation_id, state__in=HOLDING, preempt_at__lte=now).first())
    if victim is None:
        audit_exempt("not a preempted reservation at its deadline")
        return []
    group = list(Reservation.objects.select_for_update(no_key=True, skip_locked=True)
                 .select_related("pool")
                 .filter(preempted_for=victim.preempted_for, state__in=HOLDING,
                         preempt_at__lte=now).order_by("id"))
    if not group:  # another worker holds them: it does this
        audit_exempt("the preempted reservations are being released by another worker")
        return []
    requester = victim.preempted_for
    waits = Reservation.objects.filter(pk=requester, state=ReservationState.PENDING).exists()
    # Locked now (skipped if a placing worker holds it) and placed as soon as the group has
    # ended, so that nothing booked meanwhile takes the GPUs it was freed for.
    # (A gang's members are locked together, in their order, when it is placed.)
    asked = Reservation.objects.select_related("pool", "tenant").filter(
        pk=requester, state=ReservationState.PENDING)
    if not gang_of_reservation(requester):
        asked = asked.select_for_update(no_key=True, skip_locked=True)
    waiting = asked.first() if waits else None
    for member in group:
        if waits:
            started = member.during is not None and member.during.lower <= now
            end_reservation(member, to=ReservationState.RELEASED if started
                            else ReservationState.CANCELLED, now=now,
                            reason=f"preempted for {requester}")
            continue
        member.preempt_at, member.preempted_for = None, ""
        member.save(update_fields=["preempt_at", "preempted_for"])
        _tell_the_node(member)
        event_emit(tenant_id=member.tenant_id,
                   type=ReservationEvent.RESERVATION_PREEMPTION_WITHDRAWN, subject=member.id,
                   payload={"poolId": member.pool_id})
    data: dict[str, object] = {"victims": [m.id for m in group]}
    placed_now = _place_requester(waiting, now) if waiting is not None else []
    if placed_now:
        data["placedOn"] = ([a.node_id for _, a in placed_now] if waiting and waiting.gang_id
                            else placed_now[0][1].node_id)
    audit_record(tenant_id=victim.pool.tenant_id, actor_id="system",
                 action="reservation.preempted" if waits else "reservation.preempt.withdraw",
                 target=requester, data=data,
                 reason="notice given" if waits else "the request no longer waits")
    for member, allocation in placed_now:
        emit_placed(member, allocation)
    return group


def _place_requester(waiting: Reservation, now: datetime
                     ) -> list[tuple[Reservation, Allocation]]:
    """The request the victims made room for, placed now: a gang whole (its members locked
    after the victims: none of them is a victim); [] when it does not fit."""
    if not waiting.gang_id:
        allocation = try_place(waiting, waiting.pool, now)
        return [(waiting, allocation)] if allocation is not None else []
    members = lock_gang(waiting.gang_id)
    if any(m.state != ReservationState.PENDING for m in members):
        return []
    allocations = gang_place(members, waiting.pool, now)
    return list(zip(members, allocations, strict=True)) if allocations else []


def preempt_for_queue(pool_id: str) -> list[Reservation]:
    """After the pool's pending requests were offered free capacity: the first of those
    still waiting (from the head of the queue) that may preempt, does."""
    pool = Pool.objects.get(pk=pool_id)
    preemptible = [name for name, c in pool_classes(pool).items() if c.preemptible]
    if not Reservation.objects.filter(pool=pool, state__in=HOLDING, preempt_at__isnull=True,
                                      priority_class__in=preemptible).exists():
        return []
    for queued in pending_queue(pool, database_now())[:QUEUE_LOOK]:
        victims = reservation_preempt_for(reservation_id=queued.reservation_id)
        if victims:
            return victims
    return []
