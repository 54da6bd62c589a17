"""Reads the placer works on: schedulable nodes of a pool and their devices free in a window.

The grouping happens in SQL, one row per (node, NVLink domain) with the free device ids in
index order, so a pool of hundreds of nodes costs one small result set per placement.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Count, Model, Q

from compute.core.db import prepared_cursor
from compute.core.errors import InvalidArgument
from compute.core.sqltext import fill, passed_on, table, tables
from fleet.models import SCHEDULABLE, Device, DeviceClass, Node, NodeRole, Pool, ProvisionState
from reservations.device_filter import parse_selector
from reservations.models import Allocation, Booking, Sandbox
from reservations.placement import (
    BUSY,
    Candidate,
    Choice,
    Group,
    Request,
    choose,
    shortfall,
    why_not,
)
from reservations.shape import Shape

MAX_START_AHEAD = timedelta(days=366)  # the latest start a request may ask for
PAST_START_SLACK = timedelta(minutes=1)  # a start this far in the past means now
SHORTLIST = 16  # nodes of each kind (partly taken, untouched) scored for a request


def window(start: datetime, duration_ms: int) -> DateTimeTZRange:
    return DateTimeTZRange(start, start + timedelta(milliseconds=duration_ms), "[)")


def moment(now: datetime, at: datetime | None, in_ms: int | None, *,
           field: str) -> datetime | None:
    """A time given as `<field>` or `<field>In` (ms after now on the server's clock)."""
    if at is not None and in_ms is not None:
        raise InvalidArgument(f"give {field} or {field}In, not both", field=f"{field}In")
    return now + timedelta(milliseconds=in_ms) if in_ms is not None else at


LATEST_END = MAX_START_AHEAD * 2  # a window's end: the latest start, and a longest hold


def end_by(now: datetime, before: datetime | None, before_in_ms: int | None
           ) -> datetime | None:
    """The time a window must end by, from `before` or `beforeIn`; refused unless it is
    after now and within the latest start plus the longest hold."""
    before = moment(now, before, before_in_ms, field="before")
    if before is not None and not now < before <= now + LATEST_END:
        raise InvalidArgument(f"before: {before.isoformat()} is not between now and "
                              f"{LATEST_END.days} days ahead", field="before")
    return before


def later_start(now: datetime, start: datetime | None, start_in_ms: int | None, *,
                field: str = "start") -> datetime | None:
    """A request's start from `start` or `startIn`, None for now; refused when in the past
    or beyond the horizon. `field` names the pair in errors (`after`, `afterIn`)."""
    start = moment(now, start, start_in_ms, field=field)
    if start is None:
        return None
    if start < now - PAST_START_SLACK:
        raise InvalidArgument(f"{field}: {start.isoformat()} is in the past", field=field)
    if start > now + MAX_START_AHEAD:
        raise InvalidArgument(f"{field}: at most {MAX_START_AHEAD.days} days ahead",
                              field=field)
    return start if start > now else None


def instant(at: datetime) -> str:
    """A time as the API writes it, to the second, in UTC."""
    return f"{at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def host_share(pool: Pool, node_vcpus: int, node_memory: int, node_gpus: int,
               fraction: float = 1.0) -> tuple[int, int]:
    """vCPUs and GiB a booking takes per GPU (the pool's policy, else an even split), or per
    atom taking `fraction` of a GPU (rounded down)."""
    share = pool.host_share
    gpus = max(1, node_gpus)
    return (int(int(share.get("vcpusPerGpu", node_vcpus // gpus)) * fraction),
            int(int(share.get("memoryGiBPerGpu", node_memory // gpus)) * fraction))


MIG_SLICES = 7  # compute slices of an A100/H100 in MIG mode


def host_fraction(pool: Pool, device_class: str, profile: str) -> float:
    """The part of a GPU's host share one atom takes: a MIG instance its compute slices of
    seven (`3g.40gb`: 3/7), a time-sliced share one replica's."""
    if device_class == "mig":
        slices = profile.split("g.", 1)[0]
        return min(1.0, int(slices) / MIG_SLICES) if slices.isdigit() else 1 / MIG_SLICES
    if device_class == "gpu-share":
        return 1 / max(1, pool.shares_per_gpu)
    return 1.0


def device_filter_q(shape: Shape) -> Q:
    """The shape's product, MIG profile and selector as a filter over devices (validated
    names, parameterised values: nothing from the request reaches SQL as text)."""
    try:
        q = parse_selector(shape.selector).to_q()
    except InvalidArgument:  # stored before selectors were type-checked: it matches nothing
        q = Q(pk__isnull=True)
    if shape.profile:
        q &= Q(profile=shape.profile)
    return q & Q(product=shape.product) if shape.product else q


def placement_request(pool: Pool, shape: Shape) -> Request:
    """The placer's view of a shape on a pool: how many, how together, what host share."""
    return Request(count=shape.count, topology=shape.topology, device_class=shape.device_class,
                   host_fraction=host_fraction(pool, shape.device_class, shape.profile))


# The nodes worth scoring for `count` GPUs over a window: the fullest nodes with bookings in
# the window that still have `count` GPUs (best fit first), and the first nodes with none.
# Both come from one read of the pool's bookings in the window (by the index on time), which
# also gives the shortlisted nodes' bookings in the window: the work follows the bookings in
# the window, not the size of the pool or of the ledger, and a node with none costs nothing.
SHORTLIST_CTE = tables("""
in_window AS MATERIALIZED (  -- the pool's bookings in the window, with their nodes
  SELECT d.node_id, b.allocation_id, b.during, b.device_id, b.gpu_id, b.whole
    FROM {Booking} b JOIN {Device} d ON d.id = b.device_id
    JOIN {Node} n ON n.id = d.node_id
   WHERE b.during && %(during)s AND n.pool_id = %(pool)s),
touched AS MATERIALIZED (  -- the pool's nodes with bookings in the window: devices booked
  SELECT node_id, count(DISTINCT device_id) AS booked FROM in_window GROUP BY node_id),""",
      Booking=Booking, Device=Device, Node=Node)
SHORTLIST_SQL = tables("""
    AND {Node}.id IN (
      (SELECT t.node_id FROM touched t
        WHERE t.booked <= %(count_room)s + (
              SELECT count(*) FROM {Device} g
               WHERE g.node_id = t.node_id AND g.present AND g.device_class = 'gpu')
        ORDER BY t.booked DESC, t.node_id LIMIT %(shortlist)s)
      UNION ALL
      (SELECT {Node}.id FROM {Node}
        WHERE {Node}.pool_id BETWEEN %(pool)s AND %(pool)s AND {schedulable}
          AND {Node}.id NOT IN (SELECT node_id FROM touched)
        ORDER BY {Node}.pool_id, {Node}.id LIMIT %(shortlist)s))""", Device=Device, Node=Node)
# (The pool as a range of one, not `=`: then only the index on (pool, id) gives this order,
# and a statement planned once for every pool reads the first entries of the pool's own
# run of it. With `=`, Postgres could read every node in id order until the pool's first.)

# A booking `b` in the way of `device` over `during`: a booking of the device itself, and
# for a whole GPU any booking of its parts, for a part any booking of its whole GPU (the two
# EXCLUDE constraints' rules, read through the index of the second).
IN_THE_WAY = """b.gpu_id = coalesce({device}.parent_id, {device}.id) AND b.during && {during}
   AND ({device}.parent_id IS NULL OR b.device_id = {device}.id OR b.whole)"""

# One row per (schedulable node, group) with its free device ids in index order (a group is
# an NVLink domain of GPUs, or the time-sliced shares of one GPU); a
# joined string parses much faster than a text[] of hundreds of ids. A node's host share in
# use over the window is what its sandboxes hold plus the most its GPU allocations hold at
# one moment of the window (two bookings that never meet do not add up).
CANDIDATES_SQL = tables("""
WITH {touched} nodes AS MATERIALIZED (
  SELECT {Node}.id, {Node}.vcpus, {Node}.memory_gib,
         (SELECT count(*) FROM {Device} g WHERE g.node_id = {Node}.id AND g.present
             AND g.device_class = 'gpu') AS gpus FROM {Node}
   WHERE {Node}.pool_id = %(pool)s AND {schedulable}
     AND {Node}.id <> ALL(%(excluded)s) {shortlist}),
meeting AS MATERIALIZED (  -- bookings in the window first: allocations follow by key
  {meeting}),
blocked AS MATERIALIZED (  -- the nodes' devices with a booking in their way in the window
  SELECT DISTINCT {Device}.id FROM nodes JOIN {Device} ON {Device}.node_id = nodes.id
    JOIN meeting b ON {in_the_way}),
spans AS (
  SELECT DISTINCT ON (a.id) a.node_id, a.vcpus, a.memory_gib,
         greatest(lower(m.during), lower(%(during)s::tstzrange)) AS lo,
         least(upper(m.during), upper(%(during)s::tstzrange)) AS hi
    FROM meeting m JOIN {Allocation} a ON a.id = m.allocation_id
   WHERE a.ended_at IS NULL),
held AS (
  SELECT node_id, max(v) AS vcpus, max(m) AS memory FROM (
    SELECT node_id, sum(dv) OVER w AS v, sum(dm) OVER w AS m FROM (
      SELECT node_id, lo AS at, 1 AS starts, vcpus AS dv, memory_gib AS dm FROM spans
      UNION ALL
      SELECT node_id, hi, 0, -vcpus, -memory_gib FROM spans) edges
    WINDOW w AS (PARTITION BY node_id ORDER BY at, starts)) running
   GROUP BY node_id),
sandboxed AS (
  SELECT node_id, sum(vcpus) AS vcpus, sum(memory_gib) AS memory FROM {Sandbox}
   WHERE ended_at IS NULL AND node_id IN (SELECT id FROM nodes) GROUP BY node_id)
SELECT nodes.id, nodes.vcpus, nodes.memory_gib, nodes.gpus,
       coalesce(held.vcpus, 0) + coalesce(sandboxed.vcpus, 0),
       coalesce(held.memory, 0) + coalesce(sandboxed.memory, 0), {group},
       count(*),
       coalesce(string_agg({Device}.id, ',' ORDER BY {Device}.index, {Device}.uuid) FILTER (
           WHERE {Device}.health = 'healthy' {device_filter}
             AND {Device}.id NOT IN (SELECT id FROM blocked)), '')
  FROM nodes JOIN {Device} ON {Device}.node_id = nodes.id
  LEFT JOIN held ON held.node_id = nodes.id
  LEFT JOIN sandboxed ON sandboxed.node_id = nodes.id
 WHERE {Device}.present AND {Device}.device_class = %(class)s
 GROUP BY nodes.id, nodes.vcpus, nodes.memory_gib, nodes.gpus, {group},
          held.vcpus, held.memory, sandboxed.vcpus, sandboxed.memory""",
    Allocation=Allocation, Device=Device, Node=Node, Sandbox=Sandbox)
GROUP = tables("""CASE WHEN {Device}.device_class = 'gpu-share' THEN {Device}.parent_id
       ELSE {Device}.nvlink_domain END""", Device=Device)


# The nodes' bookings in the window: each device's, through the booking index; on a shortlist,
# those of the pool's bookings in the window already read.
DEVICES_MEETING = tables("""SELECT b.allocation_id, b.during, b.device_id, b.gpu_id, b.whole
    FROM nodes JOIN {Device} d ON d.node_id = nodes.id
    JOIN {Booking} b ON b.device_id = d.id AND b.during && %(during)s""",
        Booking=Booking, Device=Device)
SHORTLIST_MEETING = """SELECT allocation_id, during, device_id, gpu_id, whole FROM in_window
   WHERE node_id IN (SELECT id FROM nodes)"""


def where_sql(model: type[Model], q: Q, prefix: str) -> tuple[str, dict[str, Any]]:
    """A filter as SQL over the model's own table name, its values as named parameters
    `<prefix><n>` (so they mix with the query's own)."""
    query = model._default_manager.filter(q).query
    sql, values = query.where.as_sql(query.get_compiler(connection=connection), connection)
    names = [f"{prefix}{n}" for n in range(len(values))]
    named = sql.replace("%%", "%%%%") % tuple(f"%({name})s" for name in names)
    return named, dict(zip(names, values, strict=True))


@functools.cache
def schedulable_sql() -> str:
    tables("""fleet.models.SCHEDULABLE as SQL over `{Node}`, its constants written in (quoted by
    the driver), built once. Written in, not passed as parameters, so that a prepared
    statement's one plan knows them: as parameters, Postgres guessed that a pool held about
    one schedulable node and planned a 10,000-node pool's shortlist as a sort of it.""", Node=Node)
    sql, values = where_sql(Node, SCHEDULABLE, "schedulable")
    ops: Any = connection.ops  # compose_sql is the PostgreSQL backend's own
    return str(ops.compose_sql(sql, values)).replace("%", "%%")


ONLY_SQL = tables("AND {Node}.id = ANY(%(only)s)", Node=Node)


@functools.cache
def _candidates_sql(nodes: str) -> str:
    """The query with the schedulable filter written in; `nodes` is "all", "shortlist" or
    "only" (the nodes named)."""
    schedulable = schedulable_sql()
    among = {"all": "", "only": ONLY_SQL,
             "shortlist": fill(SHORTLIST_SQL, schedulable=schedulable)}[nodes]
    shortlist = nodes == "shortlist"
    return fill(CANDIDATES_SQL, schedulable=schedulable, shortlist=among,
                meeting=SHORTLIST_MEETING if shortlist else DEVICES_MEETING,
                touched=SHORTLIST_CTE if shortlist else "", group=GROUP,
                in_the_way=fill(IN_THE_WAY, device=table(Device), during="%(during)s"),
                **passed_on("device_filter"))


def propose(pool: Pool, during: DateTimeTZRange, request: Request, *,
            device_filter: Q | None = None, excluded: Collection[str] = (),
            whole_pool: bool = True, only: Collection[str] | None = None
            ) -> tuple[Choice | None, list[Candidate]]:
    """The placer's choice over the shortlist (or the nodes `only` names), else (unless
    `whole_pool` is false) over the whole pool (a filter or an odd node shape can leave the
    shortlist without a fit), with the candidates it scored (the whole pool's when nothing
    fits, to say why)."""
    whole = request.device_class == "gpu"  # the shortlist counts whole GPUs
    candidates = load_candidates(pool, during, request, device_filter=device_filter,
                                 excluded=excluded, shortlisted=whole, only=only)
    choice = choose(candidates, request)
    if choice is None and whole and whole_pool:
        candidates = load_candidates(pool, during, request, device_filter=device_filter,
                                     excluded=excluded)
        choice = choose(candidates, request)
    return choice, candidates


def load_candidates(pool: Pool, during: DateTimeTZRange, request: Request, *,
                    device_filter: Q | None = None, excluded: Collection[str] = (),
                    shortlisted: bool = False, only: Collection[str] | None = None
                    ) -> list[Candidate]:
    """One query: the schedulable nodes of the pool with their free devices of the
    request's class per NVLink domain; `shortlisted`, only the nodes worth scoring for that
    many whole GPUs; with `only`, those nodes."""
    sql = _candidates_sql("only" if only is not None else "shortlist" if shortlisted else "all")
    params: dict[str, Any] = {"pool": pool.id, "during": during,
                              "only": list(only or ()),
                              "excluded": list(excluded), "count_room": -request.count,
                              "shortlist": SHORTLIST, "class": request.device_class}
    filter_sql = ""
    if device_filter:
        where, values = where_sql(Device, device_filter, "filter")
        filter_sql = f"AND ({where})"
        params.update(values)
    with prepared_cursor() as cursor:
        cursor.execute(fill(sql, device_filter=filter_sql), params)
        rows = cursor.fetchall()
    groups: dict[str, list[Group]] = defaultdict(list)
    host: dict[str, tuple[int, int, int, int, int]] = {}
    for node_id, vcpus, memory, gpus, vcpus_used, memory_used, domain, size, joined in rows:
        free = joined.split(",") if joined else []
        host[node_id] = (vcpus, memory, gpus, vcpus_used, memory_used)
        if domain:
            groups[node_id].append(Group(domain, size, tuple(free)))
        else:  # no NVLink: every device is a group of one
            groups[node_id].extend(Group("", 1, (device_id,)) for device_id in free)
    candidates = []
    for node_id, (vcpus, memory, gpus, vcpus_used, memory_used) in sorted(host.items()):
        vcpus_per_gpu, memory_per_gpu = host_share(pool, vcpus, memory, gpus,
                                                   request.host_fraction)
        candidates.append(Candidate(
            node_id=node_id, groups=tuple(groups[node_id]), vcpus_free=vcpus - vcpus_used,
            memory_gib_free=memory - memory_used, vcpus_per_gpu=vcpus_per_gpu,
            memory_gib_per_gpu=memory_per_gpu))
    return candidates


def never_fits(pool: Pool, request: Request, device_filter: Q | None = None) -> str | None:
    """Why no machine of the pool could ever hold `request`, whatever is booked, down,
    cordoned or unhealthy now: none has its atoms (class, product, selector, profile) in that
    number, or that many together. None when one could, and when the pool has no machine
    yet, or one whose devices are not known yet (they may join or be inspected)."""
    machines = (Node.objects.filter(pool=pool, role=NodeRole.NODE)
                .exclude(provision_state=ProvisionState.RETIRED))
    present = Device.objects.filter(node__in=machines, present=True)
    if not machines.exists() or machines.exclude(
            id__in=present.values("node_id")).exists():
        return None
    atoms = present.filter(device_class=request.device_class)
    group = "parent_id" if request.device_class == DeviceClass.SHARE else "nvlink_domain"
    rows = (atoms.filter(device_filter or Q()).values("node_id", group)
            .annotate(size=Count("id")))
    if not rows:
        offered = ", ".join(sorted(set(atoms.values_list("product", flat=True)))) or "none"
        return (f"no machine of the pool has {request.noun} that match the request (product, "
                f"selector, profile); it has: {offered}")
    per_node: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for row in rows:
        per_node[row["node_id"]].append((row[group] or "", row["size"]))
    return shortfall(request, list(per_node.values()), machine="machine of the pool",
                     gpu="GPU of the pool")


def pending_reason(pool: Pool, during: DateTimeTZRange, candidates: Sequence[Candidate],
                   request: Request, device_filter: Q | None = None) -> str:
    """Why a request fits nowhere in `during`: no machine that could ever hold it, no node
    that can now, or, when some could, until when the bookings in the way last."""
    reason = never_fits(pool, request, device_filter) or why_not(candidates, request)
    if reason != BUSY:
        return reason
    with connection.cursor() as cursor:
        cursor.execute(
            tables("SELECT min(upper(b.during)) FROM {Booking} b "
            "JOIN {Device} d ON d.id = b.device_id JOIN {Node} n ON n.id = d.node_id "
            "WHERE n.pool_id = %s AND b.during && %s",
                Booking=Booking, Device=Device, Node=Node), [pool.id, during])
        row = cursor.fetchone()
    until: datetime | None = row[0] if row else None
    if until is None:
        return "every node that could hold it lacks the free host share (vCPUs, memory)"
    return (f"all fitting nodes are busy; the first booking in the way ends at "
            f"{instant(until)}")
