"""A production GPU-cluster trace replayed on the real ledger, against published policies.

    python -m bench.trace --nodes openb_node_list_gpu_node.csv \\
        --pods openb_pod_list_default.csv [--mode inflation|timeline] [--shares 10] [--json OUT]

Reads the public openb format (Alibaba, USENIX ATC 2023 "Beware of Fragmentation"): GPU
nodes (`sn, cpu_milli, memory_mib, gpu, model`) and tasks (`num_gpu`, `gpu_milli`, and
optionally `gpu_spec`, the acceptable models). Our placer runs as the product runs it: one
pool per GPU model on the real Postgres, one node per trace node, every task booked by the
service layer (`reservation_create`) with every model the task accepts, through the
EXCLUDE-guarded ledger. Each GPU is sliced into `--shares` time-sliced shares; a GPU-sharing
task (`gpu_milli` < 1000) asks for its fraction of one GPU, which books the fewest shares
that cover it; other tasks ask for whole GPUs; CPU-only tasks are left out.

`inflation` (the paper's method): tasks arrive in trace order, then sampled again from the
trace (seeded), with no departures, until the GPUs requested (each sharing task its fraction)
reach the cluster's GPUs. A task that fits nowhere is refused and the next one comes. At
80, 90, 95 and 100 % of the GPUs requested, prints the GPUs left unallocated (free shares
over shares per GPU) for our placer and, on the same arrivals, for the policies the paper
compares, implemented here on the same shares: random-fit, first-fit, best-fit,
dot-product, GPU packing and FGD (fragmentation gradient descent). Placement is on GPUs only:
the trace's CPU and memory requests are not booked (the ledger's host share is off), and
no policy here considers them.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import bench_environment, table

LEVELS = (80, 90, 95, 100)  # % of the cluster's GPUs requested


@dataclass(frozen=True)
class TraceNode:
    name: str
    gpus: int
    model: str
    vcpus: int
    memory_gib: int


@dataclass(frozen=True)
class Task:
    name: str
    gpus: int  # whole GPUs; 1 for a sharing task
    milli: int  # of one GPU, for a sharing task (< 1000); 1000 otherwise
    models: tuple[str, ...] = ()  # acceptable models; empty for any

    @property
    def sharing(self) -> bool:
        return self.milli < 1000

    @property
    def requested(self) -> float:
        """GPUs asked for, a sharing task its fraction."""
        return self.milli / 1000 if self.sharing else float(self.gpus)

    def shares(self, per_gpu: int) -> int:
        """Shares of one GPU a sharing task books: the fewest that cover its fraction."""
        return max(1, math.ceil(round(self.milli * per_gpu / 1000, 9)))


def read_nodes(path: Path) -> list[TraceNode]:
    with path.open() as file:
        return [TraceNode(row["sn"], int(row["gpu"]), row["model"],
                          max(1, int(row["cpu_milli"]) // 1000),
                          max(1, int(row["memory_mib"]) // 1024))
                for row in csv.DictReader(file) if int(row["gpu"]) > 0]


def read_tasks(path: Path) -> list[Task]:
    """The GPU tasks of a pod list, in trace order (CPU-only tasks left out)."""
    with path.open() as file:
        rows = list(csv.DictReader(file))
    if rows and "creation_time" in rows[0]:
        rows.sort(key=lambda row: int(row["creation_time"] or 0))
    tasks = []
    for row in rows:
        gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
        if gpus < 1 or milli < 1:
            continue
        models = tuple(m for m in (row.get("gpu_spec") or "").split("|") if m)
        tasks.append(Task(row["name"], gpus, milli if gpus == 1 else 1000, models))
    return tasks


def arrivals(tasks: Sequence[Task], capacity: float, seed: int) -> Iterator[Task]:
    """Trace order, then samples of the trace, until the requests reach `capacity` GPUs."""
    rng = random.Random(seed)
    requested = 0.0
    index = 0
    while requested < capacity:
        task = tasks[index] if index < len(tasks) else rng.choice(tasks)
        index += 1
        requested += task.requested
        yield task


# --- the policies of the paper, on an in-memory cluster of shares ---------------------------


@dataclass
class Cluster:
    """Free shares of each GPU of each node (`per_gpu` a free GPU)."""

    models: list[str]
    free: list[list[int]]
    per_gpu: int

    @classmethod
    def of(cls, nodes: Sequence[TraceNode], per_gpu: int) -> Cluster:
        return cls([n.model for n in nodes], [[per_gpu] * n.gpus for n in nodes], per_gpu)

    def unallocated(self) -> float:
        return sum(map(sum, self.free)) / self.per_gpu


# A choice: the node, and the GPUs (indexes) it books; for a sharing task one GPU.
Placement = tuple[int, tuple[int, ...]]


def options(cluster: Cluster, task: Task) -> Iterator[Placement]:
    """Every feasible (node, GPUs) for `task`: for a sharing task each GPU with room (one
    per distinct free amount on a node), for whole GPUs the node's first free ones."""
    per_gpu = cluster.per_gpu
    need = task.shares(per_gpu) if task.sharing else per_gpu
    for node, free in enumerate(cluster.free):
        if task.models and cluster.models[node] not in task.models:
            continue
        if task.sharing:
            seen: set[int] = set()
            for gpu, room in enumerate(free):
                if room >= need and room not in seen:
                    seen.add(room)
                    yield node, (gpu,)
        else:
            whole = [gpu for gpu, room in enumerate(free) if room == per_gpu]
            if len(whole) >= task.gpus:
                yield node, tuple(whole[: task.gpus])


def after(cluster: Cluster, task: Task, placement: Placement) -> list[int]:
    """The node's free shares once `placement` is booked."""
    node, gpus = placement
    free = list(cluster.free[node])
    for gpu in gpus:
        free[gpu] -= task.shares(cluster.per_gpu) if task.sharing else cluster.per_gpu
    return free


def book(cluster: Cluster, task: Task, placement: Placement) -> None:
    cluster.free[placement[0]] = after(cluster, task, placement)


Policy = Callable[[Cluster, Task, random.Random], Placement | None]


def random_fit(cluster: Cluster, task: Task, rng: random.Random) -> Placement | None:
    found = list(options(cluster, task))
    return rng.choice(found) if found else None


def first_fit(cluster: Cluster, task: Task, rng: random.Random) -> Placement | None:
    return next(options(cluster, task), None)


def best_fit(cluster: Cluster, task: Task, rng: random.Random) -> Placement | None:
    """The node left with the fewest free shares (then the tightest GPU)."""
    return min(options(cluster, task), default=None,
               key=lambda p: (sum(after(cluster, task, p)), min(after(cluster, task, p))))


def dot_product(cluster: Cluster, task: Task, rng: random.Random) -> Placement | None:
    """The node whose free capacity (as a fraction of its own) has the largest dot product
    with the task's demand (as a fraction of the node): Tetris's alignment, on GPUs."""
    def alignment(placement: Placement) -> float:
        free = cluster.free[placement[0]]
        size = len(free) * cluster.per_gpu
        demand = task.requested * cluster.per_gpu / size
        return demand * sum(free) / size

    return max(options(cluster, task), default=None, key=alignment)


def gpu_packing(cluster: Cluster, task: Task, rng: random.Random) -> Placement | None:
    """A sharing task on the fullest GPU already shared; whole GPUs on the node with the
    fewest free whole GPUs, nodes already in use first."""
    per_gpu = cluster.per_gpu

    def key(placement: Placement) -> tuple[int, ...]:
        free = cluster.free[placement[0]]
        if task.sharing:
            room = free[placement[1][0]]
            return (room == per_gpu, room, sum(r == per_gpu for r in free))
        return (sum(r == per_gpu for r in free), sum(free) == per_gpu * len(free))

    return min(options(cluster, task), default=None, key=key)


class Fgd:
    """Fragmentation gradient descent: the choice that grows the node's expected
    fragmentation least, the expectation over the workload's task types (their shares in
    the trace). A node's fragmentation for a task type is its free shares the type cannot
    use: all of them when the type fits nowhere on the node, else those on GPUs with less
    room than the type needs (for whole GPUs, every GPU not wholly free)."""

    def __init__(self, tasks: Sequence[Task], per_gpu: int) -> None:
        kinds = Counter((t.sharing, t.shares(per_gpu) if t.sharing else t.gpus) for t in tasks)
        total = sum(kinds.values())
        self.kinds = [(sharing, size, count / total) for (sharing, size), count in kinds.items()]
        self.per_gpu = per_gpu
        self.memo: dict[tuple[int, ...], float] = {}

    def fragmentation(self, free: Sequence[int]) -> float:
        key = tuple(sorted(free))
        known = self.memo.get(key)
        if known is not None:
            return known
        per_gpu, total, value = self.per_gpu, sum(key), 0.0
        for sharing, size, weight in self.kinds:
            need = size if sharing else per_gpu
            fits = (max(key) >= size) if sharing else (key.count(per_gpu) >= size)
            value += weight * (sum(r for r in key if r < need) if fits else total)
        self.memo[key] = value
        return value

    def __call__(self, cluster: Cluster, task: Task, rng: random.Random) -> Placement | None:
        def growth(placement: Placement) -> float:
            return (self.fragmentation(after(cluster, task, placement))
                    - self.fragmentation(cluster.free[placement[0]]))

        return min(options(cluster, task), default=None, key=growth)


def policy_run(policy: Policy, nodes: Sequence[TraceNode], stream: Sequence[Task],
               per_gpu: int, seed: int) -> dict[str, float]:
    cluster = Cluster.of(nodes, per_gpu)
    rng = random.Random(seed)
    return levels(stream, sum(n.gpus for n in nodes), cluster.unallocated,
                  lambda task: _book_if(cluster, task, policy(cluster, task, rng)))


def _book_if(cluster: Cluster, task: Task, placement: Placement | None) -> bool:
    if placement is not None:
        book(cluster, task, placement)
    return placement is not None


def levels(stream: Sequence[Task], capacity: int, unallocated: Callable[[], float],
           place: Callable[[Task], bool]) -> dict[str, float]:
    """Place the stream in order; the GPUs unallocated when the requests first reach each
    level of `capacity`."""
    out: dict[str, float] = {}
    requested = 0.0
    pending = list(LEVELS)
    for task in stream:
        place(task)
        requested += task.requested
        while pending and requested >= capacity * pending[0] / 100:
            out[str(pending.pop(0))] = round(unallocated(), 1)
    for level in pending:
        out[str(level)] = round(unallocated(), 1)
    return out


# --- our placer, on the real ledger ---------------------------------------------------------


class Ledger:
    """The trace's nodes as adopted nodes of one pool per model, on the real database."""

    def __init__(self, nodes: Sequence[TraceNode], per_gpu: int, *, region: str = "trace",
                 sharing: dict[str, Any] | None = None, admin: Any = None) -> None:
        """`sharing` is each pool's sharing policy; `admin` the root's principal when the
        database already has one (another ledger of the same run)."""
        from compute.platform.tenancy.selectors import root_tenant
        from compute.platform.tenancy.services import root_bootstrap
        from fleet.services.pools import pool_create
        from fleet.services.sites import site_create

        self.admin = admin or root_bootstrap().token.principal
        self.tenant = root_tenant()
        site = site_create(tenant=self.tenant, actor=self.admin, kind="shared", region=region)
        self.per_gpu = per_gpu
        self.pools = {}
        for model in sorted({n.model for n in nodes}):
            self.pools[model] = pool_create(
                tenant=self.tenant, actor=self.admin, site_id=site.id,
                pool_class="metal-host", gpu_model=model,
                policy={"hostShare": {"vcpusPerGpu": 0, "memoryGiBPerGpu": 0},
                        "timeSlicing": {"replicas": per_gpu},
                        **({"sharing": sharing} if sharing else {})})
        self._add_nodes(nodes)
        self.allocated = 0  # shares booked
        self.capacity = sum(n.gpus for n in nodes) * per_gpu

    def _add_nodes(self, nodes: Sequence[TraceNode]) -> None:
        """One node per shape made the real way (inventory, adoption), the rest cloned."""
        from django.db import connection

        from bench.booking import clone_nodes
        from tests.factories import make_node

        shapes = Counter((n.model, n.gpus, n.vcpus, n.memory_gib) for n in nodes)
        for (model, gpus, vcpus, memory), count in sorted(shapes.items()):
            template = make_node(self.pools[model], gpus=gpus, domains=(), product=model,
                                 vram=16, vcpus=vcpus, memory_gib=memory)
            clone_nodes(template, count - 1)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")

    def place(self, task: Task) -> bool:
        from reservations.services.book import reservation_create
        from reservations.services.release import reservation_release
        from reservations.shape import Shape

        models = list(task.models or self.pools)
        first = self.pools[models[0]]
        shape = (Shape(count=1, device_class="gpu-share", fraction=task.milli / 1000)
                 if task.sharing else Shape(count=task.gpus))
        rsv = reservation_create(tenant=self.tenant, actor=self.admin, pool_id=first.id,
                                 pool=first, shape=shape, duration_ms=30 * 24 * 3_600_000,
                                 models=models)
        if rsv.state == "pending":  # fits nowhere now: refused, as the policies refuse it
            reservation_release(tenant=self.tenant, actor=self.admin, reservation_id=rsv.id,
                                cancel=True)
            return False
        self.allocated += rsv.count * (1 if task.sharing else self.per_gpu)
        return True

    def unallocated(self) -> float:
        return (self.capacity - self.allocated) / self.per_gpu

    def booked_shares(self) -> int:
        """Shares booked, counted by SQL over the ledger (a whole GPU counts all its shares)."""
        from django.db import connection

        from compute.core.sqltext import tables
        from fleet.models import Device
        from reservations.models import Booking

        with connection.cursor() as cursor:
            cursor.execute(tables(
                "SELECT coalesce(sum(CASE WHEN d.device_class = 'gpu' THEN %s ELSE 1 END), 0) "
                "FROM {Booking} b JOIN {Device} d ON d.id = b.device_id "
                "WHERE upper(b.during) > now()", Booking=Booking, Device=Device),
                [self.per_gpu])
            return int(cursor.fetchone()[0])


POLICIES: dict[str, Callable[[Sequence[Task], int], Policy]] = {
    "random-fit": lambda tasks, per_gpu: random_fit,
    "first-fit": lambda tasks, per_gpu: first_fit,
    "best-fit": lambda tasks, per_gpu: best_fit,
    "dot-product": lambda tasks, per_gpu: dot_product,
    "gpu-packing": lambda tasks, per_gpu: gpu_packing,
    "fgd": Fgd,
}


def inflation(nodes: Sequence[TraceNode], tasks: Sequence[Task], per_gpu: int,
              seed: int) -> dict[str, Any]:
    capacity = sum(n.gpus for n in nodes)
    stream = list(arrivals(tasks, capacity, seed))
    print(f"{len(nodes):,} nodes, {capacity:,} GPUs of {per_gpu} shares; "
          f"{len(stream):,} task arrivals", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for name, make in POLICIES.items():
        began = time.perf_counter()
        results[name] = {"unallocatedGpus": policy_run(make(tasks, per_gpu), nodes, stream,
                                                       per_gpu, seed)}
        print(f"  {name}: {time.perf_counter() - began:.1f}s", flush=True)
    with bench_environment():
        ledger = Ledger(nodes, per_gpu)
        began = time.perf_counter()
        placed = 0

        def place(task: Task) -> bool:
            nonlocal placed
            placed += 1
            if placed % 1000 == 0:
                print(f"  ours: {placed:,} of {len(stream):,} tasks", flush=True)
            return ledger.place(task)

        ours = levels(stream, capacity, ledger.unallocated, place)
        seconds = time.perf_counter() - began
        booked = ledger.booked_shares()
        assert booked == ledger.allocated, (booked, ledger.allocated)  # the ledger agrees
        print(f"  ours (the ledger): {seconds:.1f}s, "
              f"{seconds / len(stream) * 1000:.1f} ms a task", flush=True)
    return {"mode": "inflation", "sharesPerGpu": per_gpu, "gpus": capacity,
            "arrivals": len(stream), "policies": {"ours": {"unallocatedGpus": ours}, **results}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=Path, required=True)
    parser.add_argument("--pods", type=Path, required=True)
    parser.add_argument("--mode", choices=["inflation", "timeline"], default="inflation")
    parser.add_argument("--shares", type=int, default=10, help="time-sliced shares per GPU")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    timed = parser.add_argument_group("timeline")
    timed.add_argument("--gpus", type=int, default=40,
                       help="GPUs of the sampled cluster, about (default 40)")
    timed.add_argument("--compress", type=float, default=5,
                       help="arrival times divided by this (default 5)")
    timed.add_argument("--tenants", type=int, default=8)
    timed.add_argument("--tick", type=float, default=60, help="clock step, trace seconds")
    timed.add_argument("--limit", type=int, default=None, help="the first N tasks only")
    args = parser.parse_args()
    nodes = read_nodes(args.nodes)
    if args.mode == "timeline":
        from bench.timeline import rows_of, timeline

        result = timeline(nodes, args.pods, per_gpu=args.shares, gpus=args.gpus,
                          compress=args.compress, tenants=args.tenants, tick=args.tick,
                          limit=args.limit, seed=args.seed)
        print(f"\nTimeline ({args.pods.name}), {result['gpus']} GPUs, arrivals compressed "
              f"{args.compress:g}x:")
        print(table(list(rows_of(result))))
    else:
        result = inflation(nodes, read_tasks(args.pods), args.shares, args.seed)
        rows = [{"policy": name, **{f"{level}%": figures["unallocatedGpus"][str(level)]
                                    for level in LEVELS}}
                for name, figures in result["policies"].items()]
        print(f"\nGPUs unallocated ({args.pods.name}), by share of the cluster's GPUs "
              "requested:")
        print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
