"""The booking statement: lock a node while it is schedulable, then write an allocation and
its device bookings under the ledger's constraints (reservations.constraints). A refusal
writes nothing and raises CapacityConflict (NodeFull for the node's host share)."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from compute.core.db import constraint_errors, prepared_cursor
from compute.core.errors import CapacityConflict
from compute.core.sqltext import fill, tables
from compute.platform.events.services import event_emit
from fleet.models.nodes import Node
from reservations.candidates import schedulable_sql
from reservations.constraints import (
    CLASH,
    LEDGER_CONSTRAINTS,
    NODE_MEMORY_WITHIN_SIZE,
    NODE_VCPUS_WITHIN_SIZE,
    refuse_clashes,
)
from reservations.events import ReservationEvent
from reservations.hostshare import MEETING_SPANS, RAISED_COUNTERS_SQL, counter_params
from reservations.models import Allocation, Booking, Reservation
from reservations.placement import Candidate, Choice, Request, ranked

MAX_RACES = 8  # re-reads after losing a booking race, before leaving a request pending


class NodeFull(CapacityConflict):
    """The chosen node is no longer schedulable, or its host share in the window is taken
    (another booker took it)."""


# A booking is two statements: the node's row is locked while it is schedulable (so bookers
# of one node take turns and each sees the one before), then the allocation and its device
# bookings are written, the node's counters recomputed with the new allocation counted
# over its window, and the reservation marked placed. The EXCLUDE constraint referees the
# devices, the node's CHECK constraints its host share; a refusal writes none of it.
LOCK_NODE_SQL = tables("SELECT id FROM {Node} WHERE id = %(node)s AND {schedulable} "
                       "FOR NO KEY UPDATE",
    Node=Node)
# The first node of a ranked list that no other booker holds, locked, in one statement.
LOCK_FIRST_FREE_SQL = tables("""SELECT id FROM {Node} WHERE id = ANY(%(nodes)s) AND {schedulable}
 ORDER BY array_position(%(nodes)s, id) LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED""", Node=Node)
SPREAD = 8  # next-best nodes a booker may take while other bookers hold the best


@functools.cache
def with_schedulable(template: str) -> str:
    """A locking statement with the schedulable filter written in, composed once."""
    return fill(template, schedulable=schedulable_sql())


def hold_node(candidates: list[Candidate], request: Request) -> Choice:
    """Lock the node of the best choice among `candidates` (at least one fits), or, while
    other bookers hold it, of the next best that no one holds (among the first SPREAD), so
    that bookers who all prefer one node spread over the next ones instead of queueing for
    it. When all of those are held (or no longer schedulable), wait for the best.

    Raises NodeFull when the node waited for is no longer schedulable."""
    choices = ranked(candidates, request)[:SPREAD]
    with prepared_cursor() as cursor:
        cursor.execute(with_schedulable(LOCK_FIRST_FREE_SQL),
                       {"nodes": [c.node_id for c in choices]})
        row = cursor.fetchone()
        if row is not None:
            return next(c for c in choices if c.node_id == row[0])
        cursor.execute(with_schedulable(LOCK_NODE_SQL), {"node": choices[0].node_id})
        if cursor.fetchone() is None:
            raise NodeFull("not schedulable")
    return choices[0]


BOOKING = tables(""",
allocation AS (
  INSERT INTO {Allocation} (id, reservation_id, node_id, vcpus, memory_gib,
                                       created_at)
  VALUES (%(allocation)s, %(reservation)s, %(node)s, %(vcpus)s, %(memory)s, %(created)s)
  RETURNING id),
booked AS (
  INSERT INTO {Booking} (allocation_id, device_id, during)
  SELECT allocation.id, device, %(during)s FROM allocation, unnest(%(devices)s::text[]) device
  RETURNING device_id, gpu_id, whole, during),
counted AS ({counters} RETURNING 1),
placed AS (
  UPDATE {Reservation}
     SET during = %(during)s, placed_at = %(placed_at)s, state = 'placed',
         placement_attempts = placement_attempts + 1, failure_reason = ''
   WHERE id = %(reservation)s RETURNING 1)
SELECT count(*) FROM booked mine JOIN {Booking} other ON {clash}""",
    Allocation=Allocation, Booking=Booking, Reservation=Reservation)
BOOK_SQL = MEETING_SPANS + fill(BOOKING, counters=RAISED_COUNTERS_SQL, clash=CLASH)
NODE_FULL = {NODE_VCPUS_WITHIN_SIZE: lambda: NodeFull("vCPUs"),
             NODE_MEMORY_WITHIN_SIZE: lambda: NodeFull("memory")}


def book_on_node(rsv: Reservation, choice: Choice, during: Any, *, placed_at: datetime
          ) -> Allocation:
    """Write the booking on `choice`'s node, whose row the caller holds."""
    allocation = Allocation(reservation=rsv, node_id=choice.node_id, vcpus=choice.vcpus,
                            memory_gib=choice.memory_gib)
    with constraint_errors({**LEDGER_CONSTRAINTS, **NODE_FULL}), \
            prepared_cursor() as cursor:
        cursor.execute(BOOK_SQL, {
            **counter_params(choice.node_id, vcpus=choice.vcpus, memory_gib=choice.memory_gib,
                             during=during),
            "allocation": allocation.id, "created": allocation.created_at,
            "reservation": rsv.id, "devices": sorted(choice.device_ids), "placed_at": placed_at})
        # The statement's snapshot, taken under the node's lock, holds every other booking
        # of its devices, and none of the ones it wrote: what it counts are clashes.
        refuse_clashes(cursor.fetchone()[0])
    allocation._state.adding = False  # written above
    return allocation


def gang_of(rsv: Reservation) -> dict[str, Any]:
    """A gang member's events name its gang."""
    return {"gangId": rsv.gang_id} if rsv.gang_id else {}


def emit_placed(rsv: Reservation, allocation: Allocation) -> None:
    payload = {"poolId": rsv.pool_id, "nodeId": allocation.node_id, "gpus": rsv.count,
               "allocationId": allocation.id, "start": rsv.starts_at, "end": rsv.ends_at,
               **gang_of(rsv)}
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_PLACED, subject=rsv.id,
               payload=payload)


def emit_pending(rsv: Reservation) -> None:
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_PENDING,
               subject=rsv.id, payload={"poolId": rsv.pool_id, "gpus": rsv.count,
                                        "class": rsv.device_class, **gang_of(rsv)})
