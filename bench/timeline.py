"""`bench.trace --mode timeline`: the trace's tasks arrive and leave over time on the real
ledger, scheduled by everything the sharing policies add, and by plain FIFO, in one run.

Each task arrives at its creation time (divided by `--compress`, which packs the arrivals
closer and so raises the load: the public trace fills its 6,212 GPUs to at most 66 at
once) and asks for its run time (deletion minus creation, not compressed). Its class comes
from its QoS: LS (and Guaranteed) `high`, Burstable `normal`, BE `preemptible`. The trace's
names are anonymised (`openb-pod-N`), so a task's tenant is its name's prefix when the
names have several, else its kind (CPU, memory, GPUs, GPU share and QoS: the tasks one
team submits look alike), hashed into `--tenants` tenants.

The cluster is a seeded sample of the trace's nodes of about `--gpus` GPUs, one pool per
model, made twice in one database: `ours` (pools that plan starts, tenants with offerings
granting the three classes, each of share 1, so the queue orders by priority, fair share,
then age, and preemptible work is preempted after notice) and `fifo` (every task by the
pool's owner in the default class: the pending queue in arrival order, nothing planned or
preempted). A task that accepts any model is offered every pool (`models`); when none fits
now it waits in the largest. A preempted task asks again, at once, for the rest of its run.

The ledger's clock is the trace's: the bench's database session reads `now()` from a
setting the replay advances (every statement of the service layer asks Postgres for the
time), so 149 days replay in minutes, and a wait is measured in trace seconds. Time moves
in `--tick` steps: each step expires what ended, releases what was preempted at its
deadline, lets each pool whose capacity changed reconcile as a worker would
(`reconcile_pool` for ours, `pending_place` for FIFO), then books what arrived (and, for
ours, reconciles the pools where arrivals wait, so they may preempt).

The window opens where arrivals become dense (`dense_arrivals`: the few long-lived pods
the trace records long before the rest are left out) and closes at the last arrival.
Figures, over that window: utilisation (GPU-seconds held on the ledger over the
cluster's), wait p50/p99 per class (start minus arrival, over every attempt of a task;
a task still waiting at the end counts its wait so far; the ten longest in the JSON),
preemptions, and Jain's index across tenants of the part of its demand (GPU-seconds it
would have held had it started on arrival) each tenant was given.
"""

from __future__ import annotations

import csv
import heapq
import random
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.trace import Ledger, Task, TraceNode

CLASS_OF_QOS = {"LS": "high", "Guaranteed": "high", "Burstable": "normal", "BE": "preemptible"}
QOS_OF_CLASS = {"high": "LS", "normal": "Burstable", "preemptible": "BE"}
GRANTED = ["high", "normal", "preemptible"]
NO_CAP = 1_000_000  # a quota no tenant reaches: priorities, not quotas, decide here
DRAIN_STEPS = 20_000  # steps after the last arrival, at most, for the queue to empty
DENSE = 20  # arrivals within one (uncompressed) day that open the replay's window


@dataclass(frozen=True)
class TimedTask:
    task: Task
    arrival: float  # seconds from the trace's start, compressed
    run: float  # seconds it runs
    qos: str  # LS, Burstable or BE
    tenant: str

    @property
    def gpus(self) -> float:
        return self.task.requested


def _kind(row: dict[str, str]) -> str:
    return "/".join(row[k] for k in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos"))


def read_timed(path: Path, compress: float, tenants: int) -> list[TimedTask]:
    """The GPU tasks of a pod list with their times, in arrival order."""
    with path.open() as file:
        rows = [r for r in csv.DictReader(file)
                if int(r["num_gpu"]) > 0 and int(r["gpu_milli"]) > 0]
    prefixes = {r["name"].rstrip("0123456789").rstrip("-") for r in rows}
    by_prefix = len(prefixes) > 1

    def tenant(row: dict[str, str]) -> str:
        key = row["name"].rstrip("0123456789").rstrip("-") if by_prefix else _kind(row)
        return f"t{zlib.crc32(key.encode()) % tenants}"

    tasks = []
    for row in rows:
        gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
        created, deleted = int(row["creation_time"]), int(row["deletion_time"] or 0)
        models = tuple(m for m in (row.get("gpu_spec") or "").split("|") if m)
        qos = "LS" if row["qos"] == "Guaranteed" else row["qos"]
        tasks.append(TimedTask(Task(row["name"], gpus, milli if gpus == 1 else 1000, models),
                               created / compress, max(1.0, deleted - created), qos,
                               tenant(row)))
    tasks.sort(key=lambda t: (t.arrival, t.task.name))
    return tasks


def dense_arrivals(tasks: Sequence[TimedTask], compress: float
                   ) -> tuple[list[TimedTask], float]:
    """The tasks from the moment arrivals become dense, and that moment. The trace records
    a few long-lived pods created long before the rest (openb: 37 tasks over its first 115
    days, then about 200 a day): measured from the first of them, a cluster would sit empty
    for most of the window. They are left out: they are the standing load of the trace's
    6,212 GPUs (27 GPUs for 100 days and more), which a sample of a few dozen GPUs would
    hand whole to them."""
    day = 86_400 / compress
    opening = next((t.arrival for i, t in enumerate(tasks)
                    if i + DENSE < len(tasks) and tasks[i + DENSE].arrival - t.arrival <= day),
                   tasks[0].arrival if tasks else 0.0)
    return [t for t in tasks if t.arrival >= opening], opening


def sample_nodes(nodes: Sequence[TraceNode], gpus: int, seed: int) -> list[TraceNode]:
    """A seeded sample of the nodes with about `gpus` GPUs (the models in their mix)."""
    shuffled = list(nodes)
    random.Random(seed).shuffle(shuffled)
    chosen, total = [], 0
    for node in shuffled:
        if total >= gpus:
            break
        chosen.append(node)
        total += node.gpus
    return chosen


class Clock:
    """The ledger's `now()` for this database session: a setting the replay advances. A
    function `bench_clock.now()` ahead of `pg_catalog` on the search path answers it."""

    FUNCTION = ("CREATE SCHEMA IF NOT EXISTS bench_clock; "
                "CREATE OR REPLACE FUNCTION bench_clock.now() RETURNS timestamptz "
                "LANGUAGE sql STABLE AS $$ SELECT current_setting('bench.now')::timestamptz $$")

    def __init__(self, origin: datetime) -> None:
        from django.db import connection
        from django.db.backends.signals import connection_created

        self.origin = origin
        self.seconds = 0.0
        with connection.cursor() as cursor:
            cursor.execute(self.FUNCTION)
        self._on_connect(None, connection)
        connection_created.connect(self._on_connect, weak=False)  # and on every reconnect

    def stop(self) -> None:
        """The session's own clock again."""
        from django.db import connection
        from django.db.backends.signals import connection_created

        connection_created.disconnect(self._on_connect)
        with connection.cursor() as cursor:
            cursor.execute("RESET search_path")

    def _on_connect(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET search_path TO public, bench_clock, pg_catalog")
            cursor.execute("SELECT set_config('bench.now', %s, false)", [self.at().isoformat()])

    def at(self, seconds: float | None = None) -> datetime:
        return self.origin + timedelta(seconds=self.seconds if seconds is None else seconds)

    def set(self, seconds: float) -> None:
        from django.db import connection

        self.seconds = seconds
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('bench.now', %s, false)", [self.at().isoformat()])


@dataclass
class Attempt:
    """One request of a task on the ledger: the first, or the rest of a preempted run."""

    timed: TimedTask
    asked: float  # trace seconds
    run: float
    reservation_id: str = ""


@dataclass
class Outcome:
    waits: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    held: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    demand: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    preemptions: int = 0
    refused: int = 0
    gpu_seconds: float = 0.0


class Replay:
    """One scheduler's run of the arrivals on its own pools of the shared database."""

    def __init__(self, name: str, ours: bool, nodes: Sequence[TraceNode], per_gpu: int,
                 clock: Clock, admin: Any) -> None:
        self.name, self.ours, self.clock = name, ours, clock
        sharing = {"planStarts": True} if ours else None
        self.ledger = Ledger(nodes, per_gpu, region=f"timeline-{name}", sharing=sharing,
                             admin=admin)
        self.sizes = Counter(dict.fromkeys(self.ledger.pools, 0))
        for node in nodes:
            self.sizes[node.model] += node.gpus
        self.models = [m for m, _ in self.sizes.most_common()]  # the largest pool first
        self.tenants: dict[str, Any] = {}
        self.attempts: dict[str, Attempt] = {}  # by reservation id
        self.outcome = Outcome()

    def tenant(self, label: str) -> Any:
        """The tenant a task is booked by: for ours its own, offered every pool."""
        if not self.ours:
            return self.ledger.tenant
        if label not in self.tenants:
            from compute.platform.tenancy.services import tenant_create
            from reservations.services.offerings import pool_offer

            tenant = tenant_create(actor=self.ledger.admin, slug=f"{self.name}-{label}")
            for pool in self.ledger.pools.values():  # quotas that never cap (pending
                pool_offer(tenant=self.ledger.tenant, actor=self.ledger.admin,  # counts)
                           pool_id=pool.id, to=tenant, share=1, priority_classes=GRANTED,
                           quota={"gpu": NO_CAP, "gpu-share": NO_CAP})
            self.tenants[label] = tenant
        return self.tenants[label]

    def ask(self, attempt: Attempt) -> str:
        """Book an attempt; the pool it is placed or waits in."""
        from reservations.services.book import reservation_create
        from reservations.shape import Shape

        task = attempt.timed.task
        models = [m for m in self.models if not task.models or m in task.models]
        if not models:
            self.outcome.refused += 1
            return ""
        first = self.ledger.pools[models[0]]
        shape = (Shape(count=1, device_class="gpu-share", fraction=task.milli / 1000)
                 if task.sharing else Shape(count=task.gpus))
        rsv = reservation_create(
            tenant=self.tenant(attempt.timed.tenant), actor=self.ledger.admin,
            pool_id=first.id, pool=first, shape=shape,
            duration_ms=max(1000, int(attempt.run * 1000)), models=models,
            priority_class=CLASS_OF_QOS[attempt.timed.qos] if self.ours else "normal")
        attempt.reservation_id = rsv.id
        self.attempts[rsv.id] = attempt
        return rsv.pool_id

    def due(self) -> tuple[list[str], list[str]]:
        """This run's reservations whose window ended, and those preempted whose deadline
        came."""
        from reservations.models import Reservation
        from reservations.states import HOLDING

        mine = Reservation.objects.filter(pool__in=self.ledger.pools.values(),
                                          state__in=HOLDING)
        now = self.clock.at()
        ended = list(mine.filter(during__endswith__lte=now, preempt_at__isnull=True)
                     .values_list("id", flat=True))
        preempted = list(mine.filter(preempt_at__lte=now).values_list("id", flat=True))
        return ended, preempted

    def next_change(self) -> float | None:
        """When the next window ends or deadline comes, in trace seconds."""
        from django.db.models import Min

        from reservations.models import Reservation
        from reservations.states import HOLDING

        now = self.clock.at()
        found = (Reservation.objects
                 .filter(pool__in=self.ledger.pools.values(), state__in=HOLDING)
                 .aggregate(end=Min("during__endswith"), deadline=Min("preempt_at")))
        times = [t for t in found.values() if t is not None and t > now]
        if not times:
            return None
        return (min(times) - self.clock.origin).total_seconds()

    def waiting(self) -> set[str]:
        """Pools that may place a request pending or planned to start later: the one it
        waits in and those of the other models it accepts."""
        from django.db.models import Q

        from reservations.models import Reservation

        now = self.clock.at()
        rows = Reservation.objects.filter(
            Q(state="pending") | Q(state="placed", planned=True, during__startswith__gt=now),
            pool__in=self.ledger.pools.values()).values_list("pool_id", "gpu_models")
        pools = set()
        for pool_id, models in rows:
            pools.add(pool_id)
            pools.update(self.ledger.pools[m].id for m in models or () if m in self.ledger.pools)
        return pools

    def step(self, arrived: list[Attempt]) -> None:
        from reservations.models import Reservation
        from reservations.reconcilers import reconcile_pool
        from reservations.services.pending import pending_place
        from reservations.services.preemption import reservation_preempted_release
        from reservations.services.release import reservation_expire

        changed: set[str] = set()
        ended, preempted = self.due()
        for rsv_id in ended:
            rsv = reservation_expire(reservation_id=rsv_id)
            if rsv is not None:
                changed.add(rsv.pool_id)
        for rsv_id in preempted:
            for rsv in reservation_preempted_release(reservation_id=rsv_id):
                changed.add(rsv.pool_id)
        for rsv in Reservation.objects.filter(pk__in=preempted, state="released"):
            self.outcome.preemptions += 1
            attempt = self.attempts[rsv.id]
            ran = (rsv.ended_at - rsv.during.lower).total_seconds()
            arrived.append(Attempt(attempt.timed, self.clock.seconds,
                                   max(1.0, attempt.run - ran)))
        # What freed goes to the queue first (a worker reacts to a release at once), then
        # what arrived books; ours then lets a new arrival that waits preempt.
        self._reconcile(changed, reconcile_pool, pending_place)
        asked = {self.ask(attempt) for attempt in arrived}
        if self.ours:
            self._reconcile(asked, reconcile_pool, pending_place)

    def _reconcile(self, pools: set[str], reconcile_pool: Any, pending_place: Any) -> None:
        for pool_id in sorted((pools - {""}) & self.waiting()):
            if self.ours:
                reconcile_pool(pool_id)
            else:
                pending_place(pool_id=pool_id)

    def figures(self, span: tuple[float, float], gpus: int) -> dict[str, Any]:
        """The run's figures, from the ledger's reservations."""
        from reservations.models import Reservation

        start, end = span
        out = self.outcome
        rows = Reservation.objects.filter(pk__in=list(self.attempts)).values_list(
            "id", "during", "ended_at")
        origin = self.clock.origin
        for rsv_id, during, ended_at in rows:
            attempt = self.attempts[rsv_id]
            timed = attempt.timed
            began = (during.lower - origin).total_seconds() if during else None
            if began is not None and began > self.clock.seconds:
                began = None  # planned, not started by the end
            waited_until = began if began is not None else self.clock.seconds
            out.waits[timed.qos].append(max(0.0, waited_until - attempt.asked))
            if began is None:
                continue
            finish = (during.upper - origin).total_seconds()
            if ended_at is not None:
                finish = min(finish, (ended_at - origin).total_seconds())
            held = _overlap(began, finish, start, end) * timed.gpus
            out.gpu_seconds += held
            out.held[timed.tenant] += held
        for attempt in self.attempts.values():
            if attempt.asked == attempt.timed.arrival:  # the demand of the first attempt
                timed = attempt.timed
                out.demand[timed.tenant] += _overlap(
                    timed.arrival, timed.arrival + timed.run, start, end) * timed.gpus
        served = [out.held[t] / out.demand[t] for t in out.demand if out.demand[t] > 0]
        jain = (sum(served) ** 2 / (len(served) * sum(x * x for x in served))
                if served else 1.0)
        return {"utilisation": round(out.gpu_seconds / (gpus * (end - start)), 4),
                "waitP50S": {q: round(_percentile(w, 50), 1) for q, w in sorted(out.waits.items())},
                "waitP99S": {q: round(_percentile(w, 99), 1) for q, w in sorted(out.waits.items())},
                "longestWaitsS": {q: sorted((round(x) for x in w), reverse=True)[:10]
                                  for q, w in sorted(out.waits.items())},
                "preemptions": out.preemptions, "jain": round(jain, 4),
                "tasks": {q: len(w) for q, w in sorted(out.waits.items())}}


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def replay(run: Replay, tasks: Sequence[TimedTask], tick: float) -> None:
    """Advance the clock in `tick` steps over the arrivals, then until the queue empties."""
    arrivals: list[tuple[float, int, TimedTask]] = [(t.arrival, i, t) for i, t in enumerate(tasks)]
    heapq.heapify(arrivals)
    now = arrivals[0][0] if arrivals else 0.0
    drained = 0
    began = time.perf_counter()
    while arrivals or drained < DRAIN_STEPS:
        run.clock.set(now)
        batch = []
        while arrivals and arrivals[0][0] <= now:
            _, _, timed = heapq.heappop(arrivals)
            batch.append(Attempt(timed, timed.arrival, timed.run))
        run.step(batch)
        if not arrivals:
            drained += 1
            if not run.waiting():
                break
        upcoming = [t for t in (arrivals[0][0] if arrivals else None, run.next_change())
                    if t is not None]
        if not upcoming:
            break
        now = max(now + tick, min(upcoming))
        if batch and len(arrivals) // 500 != (len(arrivals) + len(batch)) // 500:
            print(f"  {run.name}: {len(tasks) - len(arrivals):,} of {len(tasks):,} arrived, "
                  f"{time.perf_counter() - began:.0f}s", flush=True)


def timeline(nodes: Sequence[TraceNode], pods: Path, *, per_gpu: int, gpus: int,
             compress: float, tenants: int, tick: float, limit: int | None,
             seed: int) -> dict[str, Any]:
    from bench.common import bench_environment

    cluster = sample_nodes(nodes, gpus, seed)
    tasks, opening = dense_arrivals(read_timed(pods, compress, tenants), compress)
    tasks = tasks[:limit]
    size = sum(n.gpus for n in cluster)
    span = (opening, tasks[-1].arrival)
    print(f"{len(cluster):,} nodes, {size:,} GPUs of {per_gpu} shares "
          f"({', '.join(f'{m} {c}' for m, c in Counter(n.model for n in cluster).items())}); "
          f"{len(tasks):,} tasks over {(span[1] - span[0]) / 3600:.1f} h from day "
          f"{opening * compress / 86_400:.0f} of the trace "
          f"(arrivals compressed {compress:g}x), "
          f"{len({t.tenant for t in tasks})} tenants", flush=True)
    results: dict[str, Any] = {}
    with bench_environment():
        from compute.core.db import database_now

        clock = Clock(database_now().replace(microsecond=0))
        admin = None
        for name, ours in (("ours", True), ("fifo", False)):
            clock.set(span[0])
            run = Replay(name, ours, cluster, per_gpu, clock, admin)
            admin = run.ledger.admin
            began = time.perf_counter()
            replay(run, tasks, tick)
            results[name] = run.figures(span, size)
            print(f"  {name}: {time.perf_counter() - began:.0f}s", flush=True)
    return {"mode": "timeline", "sharesPerGpu": per_gpu, "gpus": size, "nodes": len(cluster),
            "tasks": len(tasks), "compress": compress, "tickS": tick, "policies": results}


def rows_of(result: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for name, figures in result["policies"].items():
        yield {"policy": name, "utilisation": f"{figures['utilisation']:.1%}",
               **{f"wait p50/p99 {q} (s)": f"{figures['waitP50S'].get(q, 0):g} / "
                                          f"{figures['waitP99S'].get(q, 0):g}"
                  for q in ("LS", "Burstable", "BE")},
               "preemptions": figures["preemptions"], "jain": figures["jain"]}
