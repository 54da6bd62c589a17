"""Gangs: multi-node reservations booked, bound and ended as one.

A gang is `nodes` member reservations of one shape (reservations.models.Gang). Its members
are placed in one transaction for one window, on distinct nodes close together
(reservations.gangplace), or all stay pending; a member becomes active only when every
member's node has reported its hold; ending one member (release, cancel, expiry, failure)
ends them all. Whoever changes a member's state holds every member's row, taken in id
order by `lock_gang` before anything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import F

from compute.core.db import insert_row, known_related, prepared_cursor
from compute.core.errors import CapacityConflict, InvalidArgument, NeverFits
from compute.core.sqltext import tables
from compute.platform.queue.work import enqueue
from compute.platform.tenancy.models import Tenant
from fleet.models import Device, DeviceClass, Node, Pool
from fleet.models.nodes import NodeRole, ProvisionState
from reservations.budgets import check_budgets
from reservations.candidates import (
    device_filter_q,
    instant,
    load_candidates,
    never_fits,
    pending_reason,
    placement_request,
    window,
)
from reservations.earliest import Search, format_duration, search_for
from reservations.gangplace import GangChoice, Place, choose_gang
from reservations.limits import check_at_once, check_request, offering_limits
from reservations.models import Allocation, Booking, Gang, Reservation, ReservationState
from reservations.placement import choose_on_node
from reservations.quotas import quota_consume
from reservations.services.booking import (
    MAX_RACES,
    NodeFull,
    book_on_node,
    emit_pending,
    emit_placed,
    with_schedulable,
)
from reservations.shape import Ask, Shape
from reservations.sharing import PriorityClass
from reservations.states import TERMINAL, transition
from reservations.work import RESERVATION, pool_replan

MAX_NODES = 64
MAX_GANG_REPLACEMENTS = 2  # the whole gang placed again at most so often, then it fails


def check_gang_request(shape: Shape, nodes: int, *, models: Sequence[str]) -> None:
    """What a multi-node request may ask: whole GPUs of its own pool."""
    if not 1 < nodes <= MAX_NODES:
        raise InvalidArgument(f"nodes: between 1 and {MAX_NODES}", field="nodes")
    if shape.device_class != DeviceClass.GPU or shape.fraction:
        raise InvalidArgument("nodes: a multi-node reservation takes whole GPUs (class gpu)",
                              field="nodes")
    if models:
        raise InvalidArgument("devices[0].models: a multi-node reservation is placed in "
                              "its own pool", field="devices")


def lock_gang(gang_id: str) -> list[Reservation]:
    """Every member's row, locked in id order, member 0 first in the list."""
    members = list(Reservation.objects.select_for_update(no_key=True, of=("self",))
                   .select_related("pool", "tenant").filter(gang_id=gang_id).order_by("id"))
    return sorted(members, key=lambda m: m.gang_index)


LOCK_NODES_SQL = tables("SELECT id FROM {Node} WHERE id = ANY(%(nodes)s) AND {schedulable} "
                        "ORDER BY id FOR NO KEY UPDATE", Node=Node)


def node_places(node_ids: Sequence[str]) -> dict[str, Place]:
    """Each node's rack and rail, from its labels."""
    return {node_id: Place.of(labels) for node_id, labels in
            Node.objects.filter(pk__in=list(node_ids)).values_list("id", "labels")}


def propose_gang(pool: Pool, during: DateTimeTZRange, shape: Shape, nodes: int, *,
                 excluded: set[str] | None = None) -> tuple[GangChoice | None, list[str]]:
    """The gang placer's choice over the whole pool, and the nodes that fit one member."""
    request = placement_request(pool, shape)
    candidates = load_candidates(pool, during, request, device_filter=device_filter_q(shape),
                                 excluded=excluded or ())
    choice = choose_gang(candidates, request, nodes,
                         node_places([c.node_id for c in candidates]))
    return choice, [c.node_id for c in candidates if choose_on_node(c, request) is not None]


def gang_place(members: list[Reservation], pool: Pool, now: datetime, *,
               during: DateTimeTZRange | None = None, excluded: set[str] | None = None
               ) -> list[Allocation] | None:
    """Book every member now (or in `during`), each on its own node, or none (they stay
    pending, each saying why). Inside the caller's transaction, which holds the members'
    rows; each attempt is a savepoint, so a lost race leaves nothing behind."""
    leader = members[0]
    shape = Shape.of(leader)
    if during is None:
        during = window(max(leader.requested_start or now, now), leader.duration_ms)
    excluded = set(excluded or ())
    for _ in range(MAX_RACES):
        choice, fitting = propose_gang(pool, during, shape, len(members), excluded=excluded)
        if choice is None:
            _waiting(members, pool, during, shape, len(fitting))
            return None
        wanted = [c.node_id for c in choice.members]
        try:
            with transaction.atomic():
                with prepared_cursor() as cursor:
                    cursor.execute(with_schedulable(LOCK_NODES_SQL), {"nodes": wanted})
                    held = {row[0] for row in cursor.fetchall()}
                if held != set(wanted):
                    excluded |= set(wanted) - held
                    raise NodeFull("not schedulable")
                allocations = [book_on_node(member, member_choice, during, placed_at=now)
                               for member, member_choice in zip(members, choice.members,
                                                                strict=True)]
        except NodeFull:
            continue
        except CapacityConflict:
            continue
        for member in members:
            member.during, member.placed_at, member.failure_reason = during, now, ""
            member.placement_attempts += 1
            transition(member, ReservationState.PLACED)
        for member in members:
            enqueue(RESERVATION, member.id, due_at=during.lower)
        return allocations
    return None


def _waiting(members: list[Reservation], pool: Pool, during: DateTimeTZRange, shape: Shape,
             fitting: int) -> None:
    request = placement_request(pool, shape)
    nodes = len(members)
    if fitting:
        reason = (f"{fitting} of the {nodes} nodes it needs have {shape.count} free "
                  f"{request.noun} in the window")
    else:
        reason = pending_reason(pool, during, [], request, device_filter_q(shape))
    Reservation.objects.filter(pk__in=[m.id for m in members]).update(
        failure_reason=reason[:300])
    for member in members:
        member.failure_reason = reason[:300]


def gang_never_fits(pool: Pool, shape: Shape, nodes: int) -> str | None:
    """Why the pool could never hold the gang: no machine holds one member, or fewer
    machines than it has members could."""
    request = placement_request(pool, shape)
    reason = never_fits(pool, request, device_filter_q(shape))
    if reason is not None:
        return reason
    machines = (Node.objects.filter(pool=pool, role=NodeRole.NODE)
                .exclude(provision_state=ProvisionState.RETIRED))
    able = sum(1 for node in machines.prefetch_related("devices")
               if sum(d.present and d.device_class == DeviceClass.GPU
                      for d in node.devices.all()) >= shape.count)
    if machines.count() and able < nodes:
        return (f"the pool has {able} machines with {shape.count} GPUs; a gang of {nodes} "
                f"needs {nodes}")
    return None


def check_gang_could_fit(pool: Pool, shape: Shape, nodes: int) -> None:
    reason = gang_never_fits(pool, shape, nodes)
    if reason is not None:
        raise NeverFits(reason, poolId=pool.id)


def new_gang(*, tenant_id: str, pool: Pool, nodes: int, member: dict[str, Any]
             ) -> tuple[Gang, list[Reservation]]:
    """A gang and its pending members, each made as `member` (a reservation's fields)."""
    gang = Gang(tenant_id=tenant_id, pool=pool, nodes=nodes)
    insert_row(gang)
    members = []
    for index in range(nodes):
        rsv = Reservation(tenant_id=tenant_id, pool=pool, gang=gang, gang_index=index,
                          **member)
        insert_row(rsv)
        members.append(rsv)
    return gang, members


def live_members(members: list[Reservation]) -> list[Reservation]:
    return [m for m in members if m.state not in TERMINAL]


def gang_bound(members: list[Reservation]) -> bool:
    """Every member's node reported its hold (a member's `binding` is what its node said)."""
    return all(m.binding is not None and m.state in (ReservationState.BINDING,
                                                     ReservationState.ACTIVE)
               for m in members)


def book_gang(*, tenant: Tenant, pool: Pool, now: datetime, shape: Shape, nodes: int,
              requested_start: datetime | None, duration_ms: int, priority: PriorityClass,
              at_earliest: bool = False, before: datetime | None = None
              ) -> tuple[list[Reservation], list[Allocation] | None]:
    """A new gang of a checked request, inside the caller's service: the offering's limits
    and the quota for all its GPUs, its members placed together (now, or with
    `at_earliest` in the earliest window where all fit) or left pending together, the
    limits at once and budgets over its window, and its events. Refusals raise and leave
    nothing."""
    limits = offering_limits(tenant.id, pool)
    check_request(limits, duration_ms=duration_ms, start=requested_start, now=now)
    quota_consume(tenant=tenant, pool=pool, resource=DeviceClass.GPU, count=shape.count * nodes)
    _gang, members = new_gang(tenant_id=tenant.id, pool=pool, nodes=nodes, member={
        "requested_start": requested_start, "duration_ms": duration_ms,
        "priority_class": priority.name, "priority": priority.weight, **shape.columns()})
    allocations = (place_gang_at_earliest(members, pool, now, before) if at_earliest
                   else gang_place(members, pool, now))
    # Its members count among what is held once written: checked with nothing added.
    during = members[0].during or window(max(requested_start or now, now), duration_ms)
    check_at_once(limits, tenant_id=tenant.id, pool=pool, gpus=0, during=during)
    check_budgets(limits, tenant_id=tenant.id, pool=pool, gpus=0, during=during,
                  priority_class=priority.name)
    for index, member in enumerate(members):
        known_related(member, "allocations", [allocations[index]] if allocations else [])
    if allocations is None:
        pool_replan(pool.id)
        for member in members:
            emit_pending(member)
    else:
        for member, allocation in zip(members, allocations, strict=True):
            emit_placed(member, allocation)
    return members, allocations


def gang_of_reservation(reservation_id: str) -> str | None:
    """The reservation's gang (None: not in one, or no such reservation)."""
    return (Reservation.objects.filter(pk=reservation_id)
            .values_list("gang_id", flat=True).first())


def locked_members(reservation_id: str, gang_id: str | None = "") -> list[Reservation]:
    """A reservation's row, locked; for a gang's member, every member's (`lock_gang`).
    `gang_id` is its gang when the caller read it already (None: not in one)."""
    if gang_id == "":
        gang_id = gang_of_reservation(reservation_id)
    if gang_id:
        return lock_gang(gang_id)
    return list(Reservation.objects.select_for_update(no_key=True, of=("self",))
                .select_related("pool", "tenant").filter(pk=reservation_id))


def gang_placed_again(gang_id: str) -> int:
    """Count one more placement of the whole gang after a failure; how many there were."""
    Gang.objects.filter(pk=gang_id).update(placements=F("placements") + 1)
    return Gang.objects.filter(pk=gang_id).values_list("placements", flat=True).get()


MAX_GANG_STARTS = 200  # starts tried by a gang's earliest search, `after` and booking ends

GANG_STARTS_SQL = tables("""
SELECT DISTINCT upper(b.during) FROM {Booking} b
  JOIN {Device} d ON d.id = b.device_id JOIN {Node} n ON n.id = d.node_id
 WHERE n.pool_id = %(pool)s AND upper(b.during) > %(after)s AND upper(b.during) <= %(latest)s
 ORDER BY 1 LIMIT %(limit)s""", Booking=Booking, Device=Device, Node=Node)


def gang_starts(pool: Pool, after: datetime, latest: datetime) -> list[datetime]:
    """Where a gang could first fit, in order: `after`, then each end of a booking in the
    pool up to `latest` (a gang that does not fit at a start fits no sooner than the next
    moment something frees)."""
    with connection.cursor() as cursor:
        cursor.execute(GANG_STARTS_SQL, {"pool": pool.id, "after": after, "latest": latest,
                                         "limit": MAX_GANG_STARTS})
        return [after, *(row[0] for row in cursor.fetchall())]


@dataclass(frozen=True)
class GangSlot:
    choice: GangChoice
    during: DateTimeTZRange


def earliest_gang(ask: Ask, nodes: int, now: datetime, after: datetime | None,
                  before: datetime | None) -> tuple[GangSlot | None, Search]:
    """The earliest window from `after` (ending by `before`, within the start horizon) in
    which the gang fits, and the search's bounds; None when it fits in none of the first
    MAX_GANG_STARTS starts."""
    search = search_for(ask, now, after, before)
    for start in gang_starts(ask.pool, search.after, search.latest_start):
        during = window(start, ask.duration_ms)
        choice, _ = propose_gang(ask.pool, during, ask.shape, nodes)
        if choice is not None:
            return GangSlot(choice, during), search
    return None, search


def gang_no_slot(ask: Ask, nodes: int, search: Search) -> str:
    return (gang_never_fits(ask.pool, ask.shape, nodes)
            or f"no {nodes} nodes have {ask.shape.count} GPUs free together for "
               f"{format_duration(search.duration)} starting between "
               f"{instant(search.after)} and {instant(search.latest_start)}")


def place_gang_at_earliest(members: list[Reservation], pool: Pool, now: datetime,
                           before: datetime | None) -> list[Allocation]:
    """Book the gang in the earliest window where all of it fits; when another booker takes
    that window first, the next one. Refused (the caller's transaction rolls back) when no
    window is left."""
    ask = Ask.of(members[0])
    after = members[0].requested_start
    for _ in range(MAX_RACES):
        slot, search = earliest_gang(ask, len(members), now, after, before)
        if slot is None:
            raise CapacityConflict(f"no earliest slot: {gang_no_slot(ask, len(members), search)}")
        start = slot.during.lower
        for member in members:
            member.requested_start = start if start > now else None
        Reservation.objects.filter(pk__in=[m.id for m in members]).update(
            requested_start=members[0].requested_start)
        allocations = gang_place(members, pool, now, during=slot.during)
        if allocations is not None:
            return allocations
        after = start + timedelta(microseconds=1)
    raise CapacityConflict("no earliest slot: other bookers took each window found first")
