"""The earliest slot: the first start at which a request fits on one node.

Whole groups first: a request for every GPU of a node (or of an NVLink domain, for
`nvlink-all`) fits exactly where that group's free time (reservations.gaps, kept by
Postgres beside the bookings) has a gap long enough, so those groups cost an index read of
their long gaps, however busy their calendars are.

Every other group is swept: each device's free stretches are the gaps between its bookings
(maintenance windows are bookings too), from which the starts it could serve a request of
`duration` form one closed span. Per node (per NVLink domain for `nvlink-all`) a sweep over
those spans counts how many devices are free at each start; the first start where enough
are free is the node's earliest. Every earliest start is either `after` or the end of a
booking, so the sweep's points are exactly those. The host share is then checked by the
placer itself at that window, so the answer is what `reservations.create` would book there.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Q

from compute.core.errors import InvalidArgument
from compute.core.sqltext import fill, passed_on, tables
from fleet.models import Device, DeviceClass, Pool
from fleet.models.nodes import Node
from reservations.candidates import (
    IN_THE_WAY,
    MAX_START_AHEAD,
    device_filter_q,
    instant,
    load_candidates,
    placement_request,
    propose,
    schedulable_sql,
    where_sql,
    window,
)
from reservations.limits import latest_start_allowed, offering_limits
from reservations.models import Booking, GroupGap, StaleGaps
from reservations.placement import BUSY, Choice, Request, why_not
from reservations.shape import Ask

NODES_TRIED = 32  # nodes' next starts read at a time
ROUNDS = 4  # reads of next starts per horizon (a start refused for host share, or taken)
# How far ahead each sweep looks: the earliest start is usually close, and a sweep costs
# what the bookings in its range cost.
HORIZONS = (timedelta(hours=6), timedelta(days=2), timedelta(days=14), timedelta(days=90))

# Devices and their groups (a node, or a node's NVLink domain for `nvlink-all`) are numbered
# here, so the sorts below compare integers, not ids.
EARLIEST_SQL = tables("""
WITH dev AS MATERIALIZED (
  SELECT {Device}.id, {Device}.parent_id, {Device}.node_id,
         (row_number() OVER ())::int AS d,
         (dense_rank() OVER (ORDER BY {Device}.node_id, CASE WHEN %(nvlink)s
                             THEN {Device}.nvlink_domain ELSE '' END))::int AS g
    FROM {Device} JOIN {Node} ON {Node}.id = {Device}.node_id
   WHERE {Node}.pool_id = %(pool)s AND {schedulable} AND {Device}.present
     AND {Device}.device_class = %(class)s AND {Device}.health = 'healthy'
     AND (NOT %(nvlink)s OR {Device}.nvlink_domain <> '') {device_filter} {only}),
busy AS MATERIALIZED (  -- what is in each device's way, by start, with the latest end so far
  SELECT dev.d, dev.g, lower(b.during) AS lo, max(upper(b.during)) OVER w AS hi,
         row_number() OVER w AS nth, lead(lower(b.during)) OVER w AS next_lo
    FROM dev JOIN {Booking} b ON {in_the_way}
  WINDOW w AS (PARTITION BY dev.d ORDER BY lower(b.during)
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)),
spans AS MATERIALIZED (  -- the starts each device could serve, as closed spans
  SELECT g, first_start, last_start FROM (
    SELECT g, %(after)s::timestamptz AS first_start,
           least(lo - %(duration)s, %(latest_start)s) AS last_start
      FROM busy WHERE nth = 1
    UNION ALL
    SELECT g, greatest(hi, %(after)s), least(next_lo - %(duration)s, %(latest_start)s)
      FROM busy
    UNION ALL
    SELECT g, %(after)s, %(latest_start)s FROM dev  -- free all along
     WHERE d NOT IN (SELECT d FROM busy)) gaps
   WHERE first_start <= last_start),
counted AS (  -- per group, how many devices are free at each span's first start
  SELECT g, at, ends, sum(delta) OVER (PARTITION BY g ORDER BY at, ends) AS free FROM (
    SELECT g, first_start AS at, 0 AS ends, 1 AS delta FROM spans
    UNION ALL
    SELECT g, last_start, 1, -1 FROM spans) sweep),
found AS (
  SELECT g, min(at) AS at FROM counted
   WHERE ends = 0 AND free >= %(count)s AND at <> ALL(%(tried)s::timestamptz[])
   GROUP BY g)
SELECT groups.node_id, min(found.at) FROM found
  JOIN (SELECT DISTINCT g, node_id FROM dev) groups ON groups.g = found.g
 GROUP BY groups.node_id ORDER BY 2, 1 LIMIT %(limit)s""",
     Booking=Booking, Device=Device, Node=Node)


# Per group of whole GPUs (a node, or its NVLink domains for `nvlink-all`): how many it has
# and how many this request may take. A group where the request takes every GPU, all of
# them eligible, is whole: its starts are those of its long gaps (or `after`, for a group
# that was never booked and so has no gap rows; every booked group has one gap to
# infinity). The nodes of the other groups that could hold the request, and those whose
# gaps are stale, are swept.
WHOLE_GROUPS_SQL = tables("""
WITH grp AS MATERIALIZED (
  SELECT {Device}.node_id,
         CASE WHEN %(nvlink)s THEN {Device}.nvlink_domain ELSE '' END AS domain,
         count(*) AS gpus, count(*) FILTER (WHERE {Device}.present
             AND {Device}.health = 'healthy' {device_filter}) AS eligible
    FROM {Device} JOIN {Node} ON {Node}.id = {Device}.node_id
   WHERE {Node}.pool_id = %(pool)s AND {schedulable}
     AND {Device}.device_class = 'gpu' AND {Device}.parent_id IS NULL
     AND (NOT %(nvlink)s OR {Device}.nvlink_domain <> '')
   GROUP BY 1, 2),
stale AS MATERIALIZED (SELECT DISTINCT node_id FROM {StaleGaps}),
whole AS MATERIALIZED (
  SELECT node_id, domain FROM grp WHERE gpus = eligible AND eligible = %(count)s
     AND node_id NOT IN (SELECT node_id FROM stale)),
long AS MATERIALIZED (  -- gaps of at least `duration` that do not end before after+duration
  SELECT node_id, domain, greatest(lo, %(after)s) AS at FROM {GroupGap}
   WHERE pool_id = %(pool)s
     AND point(end_s, length_s) <@ box(point(%(earliest_end_s)s, %(duration_s)s),
                                       point(1e16, 1e16))
     AND lo <= %(latest_start)s AND hi >= %(earliest_end)s),
starts AS (
  SELECT long.node_id, long.at FROM long JOIN whole USING (node_id, domain)
  UNION ALL
  SELECT node_id, %(after)s FROM whole WHERE (node_id, domain) NOT IN (
    SELECT node_id, domain FROM {GroupGap}
     WHERE pool_id = %(pool)s AND hi = 'infinity'))
(SELECT node_id, min(at) FROM starts WHERE at <> ALL(%(tried)s::timestamptz[])
  GROUP BY node_id ORDER BY 2, 1 LIMIT %(limit)s)
UNION ALL
SELECT DISTINCT node_id, NULL::timestamptz FROM grp
 WHERE eligible >= %(count)s AND (NOT (gpus = eligible AND eligible = %(count)s)
                                  OR node_id IN (SELECT node_id FROM stale))""",
    Device=Device, GroupGap=GroupGap, Node=Node, StaleGaps=StaleGaps)


@functools.cache
def _earliest_sql(only: bool) -> str:
    in_the_way = fill(IN_THE_WAY, device="dev",
                      during="tstzrange(%(after)s, %(latest_end)s)")
    return fill(EARLIEST_SQL, schedulable=schedulable_sql(), in_the_way=in_the_way,
                only=tables("AND {Node}.id = ANY(%(only)s)", Node=Node) if only else "",
                **passed_on("device_filter"))


@functools.cache
def _whole_groups_sql() -> str:
    return fill(WHOLE_GROUPS_SQL, schedulable=schedulable_sql(), **passed_on("device_filter"))


def earliest_starts(pool: Pool, request: Request, duration: timedelta, *, after: datetime,
                    latest_start: datetime, device_filter: Q | None = None,
                    tried: Collection[datetime] = (), limit: int = NODES_TRIED,
                    whole_groups: bool = True) -> list[tuple[datetime, str]]:
    """Per node, the first start in [after, latest_start], other than those `tried`, at
    which `request.count` of its devices (in one NVLink domain for `nvlink-all`) are free
    for `duration`; earliest first. Host shares are not considered here. Without
    `whole_groups`, every node is swept (the same answers, the slow way)."""
    params: dict[str, Any] = {
        "pool": pool.id, "nvlink": request.topology == "nvlink-all", "after": after,
        "latest_start": latest_start, "latest_end": latest_start + duration,
        "earliest_end": after + duration, "duration": duration,
        "earliest_end_s": (after + duration).timestamp(),
        "duration_s": duration.total_seconds(), "count": request.count,
        "tried": list(tried), "limit": limit, "class": request.device_class}
    filter_sql = ""
    if device_filter:
        where, values = where_sql(Device, device_filter, "filter")
        filter_sql = f"AND ({where})"
        params.update(values)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '32MB'")  # the sweep's sorts stay in memory
        starts: list[tuple[datetime, str]] = []
        swept: list[str] | None = None  # the nodes to sweep; None: the whole pool
        if whole_groups and request.device_class == DeviceClass.GPU:
            cursor.execute("SET LOCAL enable_nestloop = off")  # its estimates are poor
            cursor.execute(fill(_whole_groups_sql(), device_filter=filter_sql), params)
            rows = cursor.fetchall()
            cursor.execute("SET LOCAL enable_nestloop = on")
            starts = [(at, node_id) for node_id, at in rows if at is not None]
            swept = [node_id for node_id, at in rows if at is None]
        if swept is None or swept:
            cursor.execute(fill(_earliest_sql(only=swept is not None), device_filter=filter_sql),
                           {**params, "only": swept})
            starts += [(at, node_id) for node_id, at in cursor.fetchall()]
        return sorted(starts)[:limit]


@dataclass(frozen=True)
class Slot:
    during: DateTimeTZRange
    choice: Choice


@dataclass(frozen=True)
class Search:
    """One earliest-slot question: `request` for `duration`, starting in
    [after, latest_start], on devices matching `device_filter`."""

    pool: Pool
    request: Request
    duration: timedelta
    after: datetime
    latest_start: datetime
    device_filter: Q | None = None

    def slot(self) -> Slot | None:
        """The earliest window where the placer books the request (the same choice
        `reservations.create` makes there), or None.

        First at `after` itself, on the placer's shortlist (the common answer). Then sweeps
        over growing ranges of starts, cheapest first. A start the placer refuses
        (its host share is taken, or another booker just took it) is tried once; the next
        read skips it and sees what committed since."""
        found = self._place_at(self.after, whole_pool=False)
        if found is not None:
            return found
        tried: set[datetime] = set()
        for horizon in (*HORIZONS, self.latest_start - self.after):
            latest_start = min(self.latest_start, self.after + horizon)
            for _ in range(ROUNDS):
                starts = earliest_starts(self.pool, self.request, self.duration,
                                         after=self.after, latest_start=latest_start,
                                         device_filter=self.device_filter, tried=tried)
                if not starts:
                    break
                at_start: dict[datetime, list[str]] = {}
                for at, node_id in starts:
                    at_start.setdefault(at, []).append(node_id)
                for start in sorted(at_start):
                    found = self._place_at(start, only=at_start[start])
                    if found is not None:
                        return found
                    tried.add(start)
            if latest_start >= self.latest_start:
                return None
        return None

    def _place_at(self, start: datetime, *, whole_pool: bool = True,
                  only: list[str] | None = None) -> Slot | None:
        """The placer's choice at `start`: on its shortlist, then the whole pool, or only
        on the nodes the sweep found free then (each node's own best devices)."""
        during = DateTimeTZRange(start, start + self.duration, "[)")
        choice, _ = propose(self.pool, during, self.request, device_filter=self.device_filter,
                            whole_pool=whole_pool and only is None, only=only)
        return Slot(during, choice) if choice is not None else None

    def reason(self) -> str:
        """Why there is no slot: no node could ever hold the request, or none is free long
        enough in time."""
        candidates = load_candidates(self.pool, window(self.after, 1), self.request,
                                     device_filter=self.device_filter)
        reason = why_not(candidates, self.request)
        if reason != BUSY:
            return reason
        return (f"no node has {self.request.count} {self.request.noun} free for "
                f"{format_duration(self.duration)} starting between {instant(self.after)} "
                f"and {instant(self.latest_start)}")


def search_for(ask: Ask, now: datetime, after: datetime | None,
               before: datetime | None) -> Search:
    """The search for `ask`'s shape from `after` (default now) for a window ending by
    `before` (default: a start within the start horizon, and within the tenant's booking
    horizon when its offering limits one)."""
    start = after or now
    duration = timedelta(milliseconds=ask.duration_ms)
    horizon = latest_start_allowed(offering_limits(ask.tenant_id, ask.pool), now)
    latest_start = min(now + MAX_START_AHEAD, horizon or now + MAX_START_AHEAD)
    if before is not None:
        latest_start = min(latest_start, before - duration)
        if latest_start < start:
            raise InvalidArgument(f"before: {instant(before)} leaves no room for "
                                  f"{format_duration(duration)} after {instant(start)}",
                                  field="before")
    return Search(ask.pool, placement_request(ask.pool, ask.shape), duration, start,
                  latest_start, device_filter_q(ask.shape))


def format_duration(duration: timedelta) -> str:
    minutes = int(duration.total_seconds() // 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
