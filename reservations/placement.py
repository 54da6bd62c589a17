"""The placer: which node and which devices a GPU request should take. Pure, no ORM.

It only proposes. The caller books the choice under the ledger's EXCLUDE constraint and
asks again when another booker won the race.

A candidate node comes as groups of free devices, one group per NVLink domain (a device
without NVLink is a group of its own) or, for time-sliced shares, per GPU (so shares fill
the GPUs already shared first, and `same-gpu` takes them all of one GPU). Preferences, in
order:
1. fewest NVLink domains touched (`nvlink-all` allows exactly one);
2. complete NVLink sets: a request the size of a free domain takes that whole domain, and a
   smaller one fills the fullest partly used domain, leaving whole domains whole;
3. packing: the node with the fewest free GPUs left afterwards (best fit), so large requests
   still find room;
4. the node id, so the answer is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    """The free devices (ids, in index order) of one NVLink domain of `size` devices."""

    domain: str
    size: int
    free: tuple[str, ...]


@dataclass(frozen=True)
class Candidate:
    """A schedulable node: its free device groups over the window and its free host share."""

    node_id: str
    groups: tuple[Group, ...]
    vcpus_free: int = 0
    memory_gib_free: int = 0
    vcpus_per_gpu: int = 0
    memory_gib_per_gpu: int = 0

    @property
    def free_count(self) -> int:
        return sum(len(g.free) for g in self.groups)


ONE_GROUP = ("nvlink-all", "same-gpu")  # every atom of one group: a domain, one GPU's shares


@dataclass(frozen=True)
class Request:
    """`count` atoms of `device_class`: whole GPUs, MIG instances (of one profile) or
    time-sliced shares. Each atom takes `host_fraction` of a GPU's host share."""

    count: int
    topology: str = "any"
    device_class: str = "gpu"
    host_fraction: float = 1.0

    @property
    def noun(self) -> str:
        return {"mig": "MIG instances", "gpu-share": "GPU shares"}.get(self.device_class,
                                                                          "GPUs")


@dataclass(frozen=True, order=True)
class Score:
    domains_touched: int
    fragment_left: int
    incomplete_set: int
    node_free_after: int
    node_id: str


@dataclass(frozen=True)
class Choice:
    node_id: str
    device_ids: tuple[str, ...]
    vcpus: int
    memory_gib: int
    score: Score


def choose(candidates: Sequence[Candidate], request: Request) -> Choice | None:
    """The best node and devices for `request`, or None when it fits nowhere now."""
    best: Choice | None = None
    for candidate in candidates:
        if best is not None and candidate.free_count < request.count:
            continue
        choice = choose_on_node(candidate, request)
        if choice is not None and (best is None or choice.score < best.score):
            best = choice
    return best


def ranked(candidates: Sequence[Candidate], request: Request) -> list[Choice]:
    """Every node's best choice for `request`, the best first (`choose` gives the first)."""
    choices = (choose_on_node(candidate, request) for candidate in candidates)
    return sorted((c for c in choices if c is not None), key=lambda c: c.score)


def choose_on_node(candidate: Candidate, request: Request) -> Choice | None:
    count = request.count
    vcpus = count * candidate.vcpus_per_gpu
    memory = count * candidate.memory_gib_per_gpu
    if (count < 1 or candidate.free_count < count or vcpus > candidate.vcpus_free
            or memory > candidate.memory_gib_free):
        return None
    picked = _pick([g for g in candidate.groups if g.free], request)
    if picked is None:
        return None
    device_ids, touched, fragment_left, incomplete = picked
    score = Score(touched, fragment_left, incomplete, candidate.free_count - count,
                  candidate.node_id)
    return Choice(candidate.node_id, device_ids, vcpus, memory, score)


def _pick(groups: list[Group], request: Request
          ) -> tuple[tuple[str, ...], int, int, int] | None:
    count = request.count
    fitting = [g for g in groups if len(g.free) >= count]
    if fitting:
        # One domain: the least free one that fits (fill fragments first), complete sets
        # first among equals.
        group = min(fitting, key=lambda g: (len(g.free) - count, len(g.free) != g.size,
                                            g.free[0]))
        return group.free[:count], 1, len(group.free) - count, int(len(group.free) != group.size)
    if request.topology in ONE_GROUP:
        return None
    # Spread over as few domains as possible: the largest free groups first.
    chosen: list[str] = []
    for touched, group in enumerate(sorted(groups, key=lambda g: (-len(g.free), g.free[0])), 1):
        take = group.free[: count - len(chosen)]
        chosen.extend(take)
        if len(chosen) == count:
            return tuple(chosen), touched, len(group.free) - len(take), 1
    return None


BUSY = "busy"


def why_not(candidates: Sequence[Candidate], request: Request) -> str:
    """Why `request` fits nowhere, for a pending reservation; `BUSY` when some node could
    hold it but its GPUs or host share are taken in that window (the caller says until
    when)."""
    if not candidates:
        return "no schedulable node in the pool (adopted, reachable, not cordoned)"
    return shortfall(request, [[(g.domain, g.size) for g in c.groups] for c in candidates],
                     machine="node", gpu="GPU") or BUSY


def shortfall(request: Request, machines: Sequence[Sequence[tuple[str, int]]], *,
              machine: str, gpu: str) -> str | None:
    """What none of `machines` has for the request, in words naming them (`machine`, `gpu`);
    None when one has it. Each machine is its groups of atoms: (NVLink domain, or for shares
    their GPU, "" for none; how many)."""
    if request.topology == "nvlink-all":
        largest = max((size for groups in machines for domain, size in groups if domain),
                      default=0)
        if largest < request.count:
            return (f"no {machine} has {request.count} {request.noun} in one NVLink domain "
                    f"(the largest domain has {largest})")
    if request.topology == "same-gpu":
        largest = max((size for groups in machines for _, size in groups), default=0)
        if largest < request.count:
            return f"no {gpu} has {request.count} shares (the most is {largest})"
    most = max((sum(size for _, size in groups) for groups in machines), default=0)
    if most < request.count:
        return f"no {machine} has {request.count} {request.noun} (the largest has {most})"
    return None
