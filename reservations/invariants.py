"""The fleet's invariants, read from the ledger and from what the nodes say they hold.

I1: no device is booked twice, and each node's host counters equal the sum of its claims.
I3: every active reservation's node holds exactly its GPUs, and no node holds anything the
ledger does not; what is on its way (a binding begun, a release the node has not applied
yet, both younger than the settle time) is not a divergence. I4: nothing was released,
cancelled or placed again because of liveness alone (only the actions in `SYSTEM_MAY` are
taken without a caller). I5: no machine was retired or removed without an operator. I7: no
gang is partial: its members hold live allocations on as many distinct nodes as it has
members, or none; all of them are ended, or none; all are active, or none. Each
check returns what it found wrong (empty: the invariant holds), so a failure names its rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from audit.models import AuditEvent
from bcd.contract.holds import holds_under
from compute.core.db import database_now
from compute.core.sqltext import tables
from fleet.models import Node, NodeRole, NodeSpec, ProvisionState
from reservations.constraints import OVERLAPS_SQL
from reservations.hostshare import expected_counters
from reservations.models import Allocation, Gang, Reservation, ReservationState
from reservations.services.binding import TIMEOUT_REASON

# What the control plane does of its own accord on a healthy fleet: place, bind, end at the
# booked end, extend a series, and note that a node went silent (which changes no hold).
SYSTEM_MAY = frozenset({"reservation.place", "reservation.bind", "reservation.expire",
                        "series.extend", "node.unreachable", "audit.checkpoint"})

BINDING_FAIL = "reservation.binding_fail"
BINDING_TIMEOUT_REASON = TIMEOUT_REASON

# Held: {node id: {allocation id: {"reservation": id, "gpus": [uuid, ...]}}}, as read from
# the nodes' own hold files.
Held = dict[str, dict[str, dict[str, Any]]]


def double_bookings() -> list[str]:
    """I1, first half: pairs of bookings that overlap on one device (or a GPU and a part)."""
    with connection.cursor() as cursor:
        cursor.execute(OVERLAPS_SQL)
        count = int(cursor.fetchone()[0])
    return [f"{count} pair(s) of bookings overlap on one device"] if count else []


PARTIAL_GANGS_SQL = tables("""
SELECT g.id, g.nodes, count(a.id), count(DISTINCT a.node_id),
       count(*) FILTER (WHERE r.state IN ('released', 'cancelled', 'failed')),
       count(*) FILTER (WHERE r.state = 'active'), count(DISTINCT r.id)
  FROM {Gang} g JOIN {Reservation} r ON r.gang_id = g.id
  LEFT JOIN {Allocation} a ON a.reservation_id = r.id AND a.ended_at IS NULL
 GROUP BY g.id, g.nodes
HAVING count(a.id) NOT IN (0, g.nodes) OR count(DISTINCT a.node_id) <> count(a.id)
    OR count(*) FILTER (WHERE r.state IN ('released', 'cancelled', 'failed')) NOT IN (0, g.nodes)
    OR count(*) FILTER (WHERE r.state = 'active') NOT IN (0, g.nodes)
    OR count(DISTINCT r.id) <> g.nodes""", Gang=Gang, Reservation=Reservation,
    Allocation=Allocation)


def partial_gangs(cursor: Any = None) -> list[str]:
    """I7: gangs partly held, partly ended or partly active, in one snapshot (the caller's
    cursor, when it reads from a connection of its own)."""
    def read(cur: Any) -> list[Any]:
        cur.execute(PARTIAL_GANGS_SQL)
        return list(cur.fetchall())
    if cursor is None:
        with connection.cursor() as own:
            rows = read(own)
    else:
        rows = read(cursor)
    return [f"gang {gang} of {nodes}: {held} live allocations on {distinct} nodes, {ended} "
            f"members ended, {active} active, {count} members"
            for gang, nodes, held, distinct, ended, active, count in rows]


def counter_mismatches() -> list[str]:
    """I1, second half: host counters that differ from the sum of the node's claims."""
    wrong = []
    for node in Node.objects.filter(role=NodeRole.NODE).order_by("id"):
        expected = expected_counters(node.id)
        found = (node.vcpus_allocated, node.memory_gib_allocated)
        if found != expected:
            wrong.append(f"{node.id}: counters {found}, claims add up to {expected}")
    return wrong


def held_on(machines: dict[str, Path]) -> Held:
    """What each machine ({node id: its root}) holds, from its hold files (what a workload
    on it is given)."""
    return {node_id: {allocation: {"reservation": hold.reservation_id, "gpus": list(hold.gpus)}
                      for allocation, hold in holds_under(root).items()}
            for node_id, root in machines.items()}


def unconverged(held: Held, now: datetime, settle: timedelta) -> list[str]:
    """I3: active reservations whose node does not hold exactly their GPUs, reservations
    binding for longer than `settle`, and holds the ledger does not know (or ended more
    than `settle` ago: the node should have given them back)."""
    live = (Allocation.objects.filter(ended_at__isnull=True,
                                      reservation__state__in=[ReservationState.ACTIVE,
                                                              ReservationState.BINDING])
            .select_related("reservation").prefetch_related("bookings__device"))
    wanted = {a.id: a for a in live}
    specs = _latest_specs()
    wrong = []
    for allocation in wanted.values():
        rsv = allocation.reservation
        on_node = held.get(allocation.node_id, {}).get(allocation.id)
        if rsv.state == ReservationState.BINDING:
            if rsv.binding_started_at is None or rsv.binding_started_at < now - settle:
                wrong.append(f"{rsv.id} is still binding on {allocation.node_id}"
                             f"{_in_spec(specs, allocation.node_id, allocation.id)}")
            continue
        gpus = sorted(b.device.uuid for b in allocation.bookings.all())
        if on_node is None:
            wrong.append(f"{rsv.id} is active but {allocation.node_id} holds nothing for it")
        elif sorted(on_node.get("gpus", [])) != gpus or on_node.get("reservation") != rsv.id:
            wrong.append(f"{rsv.id} books {gpus} on {allocation.node_id}, which holds "
                         f"{sorted(on_node.get('gpus', []))} for {on_node.get('reservation')}")
    released = set(Allocation.objects.filter(ended_at__gte=now - settle)
                   .values_list("id", flat=True))
    for node_id, holds in sorted(held.items()):
        for allocation_id, hold in sorted(holds.items()):
            if allocation_id not in wanted and allocation_id not in released:
                wrong.append(f"{node_id} holds {allocation_id} ({hold.get('reservation')}), "
                             "which the ledger does not hold there"
                             f"{_in_spec(specs, node_id, allocation_id)}")
    return wrong


def _latest_specs() -> dict[str, tuple[int, set[str]]]:
    """Each node's newest desired state: its generation and the allocations it names."""
    latest = (NodeSpec.objects.order_by("node_id", "-generation").distinct("node_id")
              .values_list("node_id", "generation", "spec"))
    return {node: (generation, {a.get("allocationId") for a in spec.get("allocations", [])})
            for node, generation, spec in latest}


def _in_spec(specs: dict[str, tuple[int, set[str]]], node_id: str, allocation_id: str) -> str:
    """Whether the node's newest spec names the allocation (where a divergence began)."""
    generation, named = specs.get(node_id, (0, set()))
    return f" (its spec g{generation} {'names' if allocation_id in named else 'omits'} it)"


def liveness_actions() -> list[str]:
    """I4: what the control plane did of its own accord beyond `SYSTEM_MAY` (a binding
    failed for lack of an answer, a reservation placed again, reclaimed, replaced). A
    binding that its node refused is not liveness: `holds_refused` reports those."""
    rows = (AuditEvent.objects.filter(actor_id="system").exclude(action__in=SYSTEM_MAY)
            .exclude(action=BINDING_FAIL, reason__in=_refusals())
            .order_by("seq").values_list("action", "target", "reason")[:50])
    return [f"{action} {target}: {reason}" for action, target, reason in rows]


def holds_refused() -> list[str]:
    """Part of I3: holds the ledger booked and the node refused (its own look found the
    GPUs taken or missing): the ledger and the node disagreed."""
    rows = (AuditEvent.objects.filter(actor_id="system", action=BINDING_FAIL,
                                      reason__in=_refusals())
            .order_by("seq").values_list("target", "reason", "data")[:50])
    return [f"{target}: its node {data.get('nodeId')} refused the hold ({reason})"
            for target, reason, data in rows]


def _refusals() -> list[str]:
    return list(AuditEvent.objects.filter(actor_id="system", action=BINDING_FAIL)
                .exclude(reason=BINDING_TIMEOUT_REASON).values_list("reason", flat=True)
                .distinct())


def machines_lost(joined: list[str]) -> list[str]:
    """I5: machines that joined and are now gone, or retired with nobody asking."""
    present = dict(Node.objects.filter(id__in=joined).values_list("id", "provision_state"))
    wrong = [f"{node_id} joined and is gone" for node_id in joined if node_id not in present]
    retired = [node_id for node_id, state in present.items()
               if state == ProvisionState.RETIRED]
    by_hand = set(AuditEvent.objects.filter(target__in=retired, action="node.retire")
                  .exclude(actor_id="system").values_list("target", flat=True))
    wrong += [f"{node_id} was retired with no operator asking" for node_id in retired
              if node_id not in by_hand]
    return wrong


@transaction.atomic
def check(read_held: Callable[[], Held], joined: list[str], settle: float) -> dict[str, Any]:
    """Every check, and how much each looked at, all read from one snapshot (a node's
    counters and its bookings as of the same moment). The nodes' holds are read once the
    snapshot is taken, so a hold bound before it is on disk when they are read."""
    with connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    now = database_now()  # the first query takes the snapshot
    held = read_held()
    active = Allocation.objects.filter(ended_at__isnull=True,
                                       reservation__state=ReservationState.ACTIVE).count()
    return {"I1": double_bookings() + counter_mismatches(),
            "I3": unconverged(held, now, timedelta(seconds=settle)) + holds_refused(),
            "I4": liveness_actions(), "I5": machines_lost(joined), "I7": partial_gangs(),
            "looked": {"active": active, "gangs": Gang.objects.count(),
                       "holds": sum(len(h) for h in held.values()),
                       "nodes": Node.objects.filter(role=NodeRole.NODE).count()}}
