"""A node's host counters over time.

A node's vCPUs and memory are held by sandboxes (from now until they end) and by GPU
allocations (each over its booked window). Two GPU bookings of one node that never meet in
time must not add up, or a node could hold only one future booking of its whole size. So
the counters (`vcpus_allocated`, `memory_gib_allocated`) are what the node's live sandboxes
hold plus the most that its live GPU allocations hold at any one moment of their windows (an
allocation is live until it is freed, at the latest when its window ends). The node's CHECK
constraints (counters within the node's size) referee both kinds of claim; a sandbox, being
open-ended, fits only under that peak.

A booking raises the counters to what its own window holds with it (only the allocations
that meet that window can add up with it); freeing or moving an allocation recounts the
node's whole calendar, since the peak may fall. Both run in a statement after the node's row
is locked, so they see every booker of the node that committed before: a booking that does
not fit is refused at once, and the booker tries another node.

Whatever wrote them, the claims are refereed again at commit: a deferred constraint trigger
on allocations, their bookings, sandboxes and the node's size locks the node's row and
writes the claims that row raised (a GPU allocation's within its window, with
`bc_node_claims_within`; a sandbox's or a new size's over the whole calendar, with
`bc_node_claims`) into the counters, where the CHECK constraints refuse a node over its
size, in a statement that sees every commit before the lock (reservations/migrations/0015).
No path of this code, nor SQL written by hand, can commit a node's claims above its size.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from compute.core.sqltext import fill, tables
from fleet.models.devices import Device
from fleet.models.nodes import Node
from reservations.models import Allocation, Booking, Sandbox

# The most that the allocations in `spans` hold at one moment. Ends sort before starts at
# the same instant: windows are [).
PEAK_SQL = """
SELECT coalesce(max(v), 0) AS vcpus, coalesce(max(m), 0) AS memory FROM (
  SELECT sum(dv) OVER w AS v, sum(dm) OVER w AS m FROM (
    SELECT lo AS at, 1 AS starts, vcpus AS dv, memory_gib AS dm FROM spans
    UNION ALL
    SELECT hi, 0, -vcpus, -memory_gib FROM spans) edges
  WINDOW w AS (ORDER BY at, starts)) running"""

SANDBOXES_SQL = fill(tables("""
sandboxes AS (
  SELECT coalesce(sum(vcpus), 0) AS vcpus, coalesce(sum(memory_gib), 0) AS memory
    FROM {Sandbox} WHERE node_id = %(node)s AND ended_at IS NULL),
peak AS ({peak})""", Sandbox=Sandbox), peak=PEAK_SQL)

# The counters written from the node's claims as Postgres counts them (bc_node_claims, the
# same recount its commit-time referee writes: reservations/migrations/0015).
COUNTERS_SQL = tables("""
UPDATE {Node} SET (vcpus_allocated, memory_gib_allocated) =
       (SELECT vcpus, memory FROM bc_node_claims(%(node)s)) WHERE id = %(node)s""", Node=Node)
EXPECTED_SQL = "SELECT vcpus, memory FROM bc_node_claims(%(node)s)"

# Booking %(during)s: only the live allocations of %(node)s that meet it can add up with the
# new one (found through the devices' booking index), clipped to it, plus the new one. The
# counters become the larger of what they were and what that window now holds.
MEETING_SPANS = fill(tables("""
WITH meeting AS MATERIALIZED (  -- bookings in the window first: allocations follow by key
  SELECT b.allocation_id, b.during FROM {Device} d
    JOIN {Booking} b ON b.device_id = d.id AND b.during && %(during)s
   WHERE d.node_id = %(node)s),
spans AS (
  (SELECT DISTINCT ON (a.id) a.vcpus, a.memory_gib,
          greatest(lower(m.during), lower(%(during)s::tstzrange)) AS lo,
          least(upper(m.during), upper(%(during)s::tstzrange)) AS hi
     FROM meeting m JOIN {Allocation} a ON a.id = m.allocation_id
    WHERE a.ended_at IS NULL)
  UNION ALL
  SELECT %(vcpus)s, %(memory)s, lower(%(during)s::tstzrange), upper(%(during)s::tstzrange)),
{sandboxes}""", Allocation=Allocation, Booking=Booking, Device=Device), sandboxes=SANDBOXES_SQL)

# The counters raised to what the booked window holds; a CHECK violation: it does not fit.
RAISED_COUNTERS_SQL = tables("""
UPDATE {Node}
   SET vcpus_allocated = greatest(vcpus_allocated, sandboxes.vcpus + peak.vcpus),
       memory_gib_allocated = greatest(memory_gib_allocated, sandboxes.memory + peak.memory)
  FROM sandboxes, peak WHERE {Node}.id = %(node)s""", Node=Node)


def counter_params(node_id: str, *, vcpus: int = 0, memory_gib: int = 0,
                   during: DateTimeTZRange | None = None) -> dict[str, Any]:
    """Parameters of the spans: the node, and the allocation being booked, if any."""
    return {"node": node_id, "vcpus": vcpus, "memory": memory_gib, "during": during}


def host_counters_refresh(node_id: str) -> None:
    """Recompute the node's counters after a GPU allocation ended or moved, under the node's
    row lock (`node_lock`, which the caller took before it changed the bookings), so the
    recount sees every committed claimer; raises the node's CHECK violation (IntegrityError)
    if its claims no longer fit (never after a release: claims over a node's size are
    refused at every commit, so giving one back cannot find any)."""
    with connection.cursor() as cursor:
        cursor.execute(COUNTERS_SQL, counter_params(node_id))


def node_lock(node_id: str) -> None:
    """Take the node's row lock, as bookers take it before they write its bookings: a
    service that changes a node's bookings takes it first, or it and a booker can each
    hold what the other waits for (the booker the node, it a booking the booker's
    EXCLUDE check must wait on)."""
    with connection.cursor() as cursor:
        cursor.execute(tables("SELECT 1 FROM {Node} WHERE id = %s FOR NO KEY UPDATE",
            Node=Node), [node_id])


def expected_counters(node_id: str) -> tuple[int, int]:
    """What the node's counters should read (for checks, not for booking)."""
    with connection.cursor() as cursor:
        cursor.execute(EXPECTED_SQL, counter_params(node_id))
        vcpus, memory = cursor.fetchone()
    return int(vcpus), int(memory)
