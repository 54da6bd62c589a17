"""The placer: which node and which devices a GPU request should take. Pure, no ORM.

It only proposes. The caller books the choice under the ledger's EXCLUDE constraint and
asks again when another booker won the race.

Preferences, in order:
1. fewest NVLink domains touched (`nvlink-all` allows exactly one);
2. complete NVLink sets: a request the size of a free domain takes that whole domain, and a
   smaller one fills the fullest partly used domain, leaving whole domains whole;
3. packing: the node with the fewest free GPUs left afterwards (best fit), so large requests
   still find room;
4. the node id, so the answer is deterministic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FreeDevice:
    id: str
    uuid: str
    index: int
    product: str
    model: str
    vram_gib: int
    nvlink_domain: str = ""


@dataclass(frozen=True)
class Candidate:
    """A schedulable node with the devices free over the requested window."""

    node_id: str
    free: Sequence[FreeDevice]
    domain_sizes: dict[str, int] = field(default_factory=dict)
    vcpus_free: int = 0
    memory_gib_free: int = 0
    vcpus_per_gpu: int = 0
    memory_gib_per_gpu: int = 0


@dataclass(frozen=True)
class Request:
    count: int
    topology: str = "any"
    device_filter: Callable[[FreeDevice], bool] = lambda device: True


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
    devices: tuple[FreeDevice, ...]
    vcpus: int
    memory_gib: int
    score: Score


def choose(candidates: Sequence[Candidate], request: Request) -> Choice | None:
    """The best node and devices for `request`, or None when it fits nowhere now."""
    best: Choice | None = None
    for candidate in candidates:
        choice = choose_on_node(candidate, request)
        if choice is not None and (best is None or choice.score < best.score):
            best = choice
    return best


def choose_on_node(candidate: Candidate, request: Request) -> Choice | None:
    vcpus = request.count * candidate.vcpus_per_gpu
    memory = request.count * candidate.memory_gib_per_gpu
    if vcpus > candidate.vcpus_free or memory > candidate.memory_gib_free:
        return None
    usable = [d for d in candidate.free if request.device_filter(d)]
    if len(usable) < request.count or request.count < 1:
        return None
    groups = _groups(usable)
    picked = _pick(groups, candidate.domain_sizes, request)
    if picked is None:
        return None
    devices, domains_touched, fragment_left, incomplete = picked
    score = Score(domains_touched, fragment_left, incomplete,
                  len(candidate.free) - request.count, candidate.node_id)
    return Choice(candidate.node_id, tuple(devices), vcpus, memory, score)


def _groups(devices: list[FreeDevice]) -> list[list[FreeDevice]]:
    """Free devices by NVLink domain; a device without a domain is a group of its own."""
    by_domain: dict[str, list[FreeDevice]] = defaultdict(list)
    singles: list[list[FreeDevice]] = []
    for device in sorted(devices, key=lambda d: (d.index, d.id)):
        if device.nvlink_domain:
            by_domain[device.nvlink_domain].append(device)
        else:
            singles.append([device])
    return [*by_domain.values(), *singles]


def _pick(groups: list[list[FreeDevice]], domain_sizes: dict[str, int],
          request: Request) -> tuple[list[FreeDevice], int, int, int] | None:
    count = request.count

    def size(group: list[FreeDevice]) -> int:
        return domain_sizes.get(group[0].nvlink_domain, len(group))

    fitting = [g for g in groups if len(g) >= count]
    if fitting:
        # One domain: the least free one that fits (fill fragments first), complete sets
        # first among equals.
        group = min(fitting, key=lambda g: (len(g) - count, len(g) != size(g), g[0].index))
        return group[:count], 1, len(group) - count, int(len(group) != size(group))
    if request.topology == "nvlink-all":
        return None
    # Spread over as few domains as possible: the largest free groups first.
    chosen: list[FreeDevice] = []
    for touched, group in enumerate(sorted(groups, key=lambda g: (-len(g), g[0].index)), 1):
        take = group[: count - len(chosen)]
        chosen.extend(take)
        if len(chosen) == count:
            return chosen, touched, len(group) - len(take), 1
    return None
