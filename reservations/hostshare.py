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
is locked, so they see every booker of the node that committed before.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

# The most that the allocations in `spans` hold at one moment. Ends sort before starts at
# the same instant: windows are [).
PEAK_SQL = """
SELECT coalesce(max(v), 0) AS vcpus, coalesce(max(m), 0) AS memory FROM (
  SELECT sum(dv) OVER w AS v, sum(dm) OVER w AS m FROM (
    SELECT lo AS at, 1 AS starts, vcpus AS dv, memory_gib AS dm FROM spans
    UNION ALL
    SELECT hi, 0, -vcpus, -memory_gib FROM spans) edges
  WINDOW w AS (ORDER BY at, starts)) running"""

SANDBOXES_SQL = """
sandboxes AS (
  SELECT coalesce(sum(vcpus), 0) AS vcpus, coalesce(sum(memory_gib), 0) AS memory
    FROM reservations_sandbox WHERE node_id = %(node)s AND ended_at IS NULL),
peak AS ({peak})""".replace("{peak}", PEAK_SQL)

logger = logging.getLogger(__name__)

# Every live GPU allocation of %(node)s over its window: the recount after one ended or moved.
ALL_SPANS = """
WITH spans AS (
  SELECT a.vcpus, a.memory_gib, min(lower(b.during)) AS lo, max(upper(b.during)) AS hi
    FROM reservations_allocation a JOIN reservations_booking b ON b.allocation_id = a.id
   WHERE a.node_id = %(node)s AND a.ended_at IS NULL
   GROUP BY a.id),{sandboxes}""".replace("{sandboxes}", SANDBOXES_SQL)

# Booking %(during)s: only the live allocations of %(node)s that meet it can add up with the
# new one (found through the devices' booking index), clipped to it, plus the new one. The
# counters become the larger of what they were and what that window now holds.
MEETING_SPANS = """
WITH meeting AS MATERIALIZED (  -- bookings in the window first: allocations follow by key
  SELECT b.allocation_id, b.during FROM fleet_device d
    JOIN reservations_booking b ON b.device_id = d.id AND b.during && %(during)s
   WHERE d.node_id = %(node)s),
spans AS (
  (SELECT DISTINCT ON (a.id) a.vcpus, a.memory_gib,
          greatest(lower(m.during), lower(%(during)s::tstzrange)) AS lo,
          least(upper(m.during), upper(%(during)s::tstzrange)) AS hi
     FROM meeting m JOIN reservations_allocation a ON a.id = m.allocation_id
    WHERE a.ended_at IS NULL)
  UNION ALL
  SELECT %(vcpus)s, %(memory)s, lower(%(during)s::tstzrange), upper(%(during)s::tstzrange)),
{sandboxes}""".replace("{sandboxes}", SANDBOXES_SQL)

# The counters' new values, written to the node; a CHECK violation means they do not fit.
COUNTERS_SQL = """
UPDATE fleet_node SET vcpus_allocated = sandboxes.vcpus + peak.vcpus,
                      memory_gib_allocated = sandboxes.memory + peak.memory
  FROM sandboxes, peak WHERE fleet_node.id = %(node)s"""
RAISED_COUNTERS_SQL = """
UPDATE fleet_node
   SET vcpus_allocated = greatest(vcpus_allocated, sandboxes.vcpus + peak.vcpus),
       memory_gib_allocated = greatest(memory_gib_allocated, sandboxes.memory + peak.memory)
  FROM sandboxes, peak WHERE fleet_node.id = %(node)s"""

# After a release: never refused. Should the node's claims exceed its size (they never
# should: every claim is checked), the counters stop at the size, so nothing more fits until
# enough is released, and the excess is returned to be logged.
FREED_COUNTERS_SQL = """
UPDATE fleet_node
   SET vcpus_allocated = least(fleet_node.vcpus, sandboxes.vcpus + peak.vcpus),
       memory_gib_allocated = least(fleet_node.memory_gib, sandboxes.memory + peak.memory)
  FROM sandboxes, peak WHERE fleet_node.id = %(node)s
RETURNING sandboxes.vcpus + peak.vcpus - fleet_node.vcpus,
          sandboxes.memory + peak.memory - fleet_node.memory_gib"""

EXPECTED_SQL = """
SELECT sandboxes.vcpus + peak.vcpus, sandboxes.memory + peak.memory FROM sandboxes, peak"""


def counter_params(node_id: str, *, vcpus: int = 0, memory_gib: int = 0,
                   during: DateTimeTZRange | None = None) -> dict[str, Any]:
    """Parameters of the spans: the node, and the allocation being booked, if any."""
    return {"node": node_id, "vcpus": vcpus, "memory": memory_gib, "during": during}


def host_counters_refresh(node_id: str, *, freed: bool = False) -> None:
    """Recompute the node's counters after a GPU allocation ended or moved. Locks the node's
    row first, so the recount sees every committed booker; raises the node's CHECK
    violation (IntegrityError) if its claims no longer fit, unless the allocation was
    `freed` (a release is never refused: see FREED_COUNTERS_SQL)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM fleet_node WHERE id = %s FOR UPDATE", [node_id])
        if not freed:
            cursor.execute(ALL_SPANS + COUNTERS_SQL, counter_params(node_id))
            return
        cursor.execute(ALL_SPANS + FREED_COUNTERS_SQL, counter_params(node_id))
        vcpus_over, memory_over = cursor.fetchone()
    if vcpus_over > 0 or memory_over > 0:
        logger.error("node %s: its claims exceed its size by %s vCPUs and %s GiB; its "
                     "counters stay at its size until enough is released", node_id,
                     max(0, vcpus_over), max(0, memory_over))


def expected_counters(node_id: str) -> tuple[int, int]:
    """What the node's counters should read (for checks, not for booking)."""
    with connection.cursor() as cursor:
        cursor.execute(ALL_SPANS + EXPECTED_SQL, counter_params(node_id))
        vcpus, memory = cursor.fetchone()
    return int(vcpus), int(memory)
