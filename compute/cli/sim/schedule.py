"""The simulator's plan: a workload and a fault schedule, derived from the seed alone.

Times are simulated seconds from the start; the run divides them by its time scale. The
same seed, node count and length always give the same plan, so a failing seed reruns with
the same faults at the same moments (what each operation picks among the reservations
alive at that moment may differ, as timing does).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

# Every fault a run can inject. Each plan holds each kind at least once when it is long
# enough, so a short run still covers them all.
FAULTS = ("kill-agent", "kill-agent-before-act", "kill-agent-after-act", "journal-loss",
          "kill-gateway", "kill-worker", "kill-api", "partition", "postgres-restart",
          "postgres-kill", "clock-skew")
PARTITIONS = ("drop", "freeze", "delay", "reset")
OPERATIONS = ("reserve", "reserve", "reserve", "reserve-later", "release", "extend",
              "command", "cordon", "reserve", "reserve-later", "release", "extend", "command",
              "sandbox", "sandbox-release")


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    target: str = ""
    duration: float = 0.0  # a partition's, in simulated seconds
    mode: str = ""  # a partition's: drop, freeze, delay or reset
    skew: float = 0.0  # a clock skew's, in seconds

    def describe(self) -> str:
        extra = {"partition": f" {self.mode} for {self.duration:.0f}s",
                 "clock-skew": f" {self.skew:+.0f}s"}.get(self.kind, "")
        return f"{self.kind} {self.target}{extra}".rstrip()


@dataclass(frozen=True)
class Operation:
    at: float
    kind: str
    burst: int = 1  # how many at once (concurrent clients)
    gpus: int = 1
    duration: float = 0.0  # simulated seconds
    start_in: float = 0.0
    pick: int = 0  # which of the live reservations or nodes it acts on
    nodes: int = 1  # a gang's, for reserve-gang


@dataclass(frozen=True)
class Plan:
    seed: int
    nodes: int
    seconds: float
    operations: tuple[Operation, ...]
    faults: tuple[Fault, ...]
    joins: tuple[float, ...]  # when a new machine joins

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "nodes": self.nodes, "seconds": self.seconds,
                "faults": [asdict(f) for f in self.faults], "joins": list(self.joins),
                "operations": len(self.operations)}


def plan(seed: int, nodes: int, minutes: float, only: tuple[str, ...] = ()) -> Plan:
    """The seed's plan; with `only`, its faults are of those kinds alone (as many, at the
    same moments), to repeat one fault all run long."""
    rng = random.Random(seed)  # noqa: S311 (a reproducible plan, not a secret)
    seconds = minutes * 60
    operations = []
    at = 0.0
    while True:
        at += rng.expovariate(1 / 4)  # an operation every 4 simulated seconds on average
        if at >= seconds * 0.9:
            break
        kind = rng.choice(OPERATIONS)
        operations.append(Operation(
            at=at, kind=kind, burst=rng.choice((1, 1, 2, 4, 8)) if kind.startswith("reserve")
            else 1, gpus=rng.choice((1, 1, 2, 4, 8)), duration=rng.uniform(120, 900),
            start_in=rng.uniform(20, 240), pick=rng.randrange(1 << 30)))
    # A rush: eight one-GPU requests at once, short ones (a job array arriving), thrice a
    # simulated minute or more; concurrent bookers are what the EXCLUDE constraint referees.
    at = 0.0
    while (at := at + rng.uniform(10, 25)) < seconds * 0.9:
        operations.append(Operation(at=at, kind="reserve", burst=8, gpus=1,
                                    duration=rng.uniform(60, 120), pick=rng.randrange(1 << 30)))
    operations += _gangs(seed, nodes, seconds)
    operations.sort(key=lambda op: op.at)
    count = max(len(FAULTS), round(minutes * 2))
    kinds = list(FAULTS) + [rng.choice(FAULTS) for _ in range(count - len(FAULTS))]
    rng.shuffle(kinds)
    if only:
        kinds = [only[n % len(only)] for n in range(len(kinds))]
    times = sorted(rng.uniform(seconds * 0.1, seconds * 0.75) for _ in kinds)
    faults = tuple(_fault(rng, kind, at, nodes) for kind, at in zip(kinds, times, strict=True))
    joins = tuple(sorted(rng.uniform(seconds * 0.2, seconds * 0.6)
                         for _ in range(max(1, nodes // 4))))
    return Plan(seed=seed, nodes=nodes, seconds=seconds, operations=tuple(operations),
                faults=faults, joins=joins)


def _gangs(seed: int, nodes: int, seconds: float) -> list[Operation]:
    """Multi-node reservations of 2 or 3 nodes of 2 or 4 GPUs each, one every 30-90
    simulated seconds, from their own stream of the seed (so the rest of a seed's plan is
    what it was before gangs were part of it)."""
    rng = random.Random(seed * 7919 + 1)  # noqa: S311 (a reproducible plan)
    gangs, at = [], 0.0
    while nodes >= 2 and (at := at + rng.uniform(30, 90)) < seconds * 0.9:
        gangs.append(Operation(at=at, kind="reserve-gang", nodes=rng.randint(2, min(3, nodes)),
                               gpus=rng.choice((2, 4)), duration=rng.uniform(60, 300),
                               pick=rng.randrange(1 << 30)))
    return gangs


def _fault(rng: random.Random, kind: str, at: float, nodes: int) -> Fault:
    node = f"node-{rng.randint(1, nodes):02d}"
    if kind == "partition":
        return Fault(at, kind, node, duration=rng.uniform(20, 90), mode=rng.choice(PARTITIONS))
    if kind == "clock-skew":
        return Fault(at, kind, node, skew=rng.choice((-1, 1)) * rng.uniform(30, 600))
    if kind == "kill-worker":
        return Fault(at, kind, f"worker-{rng.randint(1, 2)}")
    if kind in ("kill-gateway", "kill-api"):
        return Fault(at, kind, kind.removeprefix("kill-"))
    if kind.startswith("postgres-"):
        return Fault(at, kind, "postgres")
    return Fault(at, kind, node)
