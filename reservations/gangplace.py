"""The gang placer: which nodes a multi-node request takes. Pure, no ORM.

A gang takes `nodes` distinct nodes, each the placer's own best choice for one member
(`placement.choose_on_node`). Nodes close together are preferred: the gang is packed into
the fewest racks, then into one rail (an InfiniBand rail or leaf switch) where it can, then
onto the nodes the single-node placer scores best. A rack that holds the whole gang is
chosen best fit (the one with the fewest fitting nodes), so large gangs still find a rack.
Nodes without topology labels count as one unnamed rack and rail.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reservations.placement import Candidate, Choice, Request, choose_on_node

RACK, RAIL = "rack", "rail"  # the node labels the placer reads


@dataclass(frozen=True)
class Place:
    """Where a node sits: its rack and its rail ("" when not labelled)."""

    rack: str = ""
    rail: str = ""

    @classmethod
    def of(cls, labels: Mapping[str, object] | None) -> Place:
        labels = labels or {}
        return cls(str(labels.get(RACK, "") or ""), str(labels.get(RAIL, "") or ""))


@dataclass(frozen=True)
class GangChoice:
    members: tuple[Choice, ...]  # one per node, in node id order
    racks: tuple[str, ...]
    rails: tuple[str, ...]

    def summary(self) -> str:
        """How close together it is, in words: `2 racks (r1, r2), one rail (a)`."""
        def named(kind: str, names: tuple[str, ...]) -> str:
            labelled = [n for n in names if n]
            if not labelled:
                return f"no {kind} labels"
            count = "one" if len(names) == 1 else str(len(names))
            return f"{count} {kind}{'s' if len(names) > 1 else ''} ({', '.join(labelled)})"
        return f"{named('rack', self.racks)}, {named('rail', self.rails)}"


def choose_gang(candidates: Sequence[Candidate], request: Request, nodes: int,
                places: Mapping[str, Place]) -> GangChoice | None:
    """The best `nodes` nodes for a gang of `request` each, or None when fewer fit now."""
    fitting = [c for c in (choose_on_node(candidate, request) for candidate in candidates)
               if c is not None]
    if nodes < 1 or len(fitting) < nodes:
        return None
    fitting.sort(key=lambda choice: choice.score)
    here = {choice.node_id: places.get(choice.node_id, Place()) for choice in fitting}
    scopes: list[list[Choice]] = [fitting]
    by_rail: dict[str, list[Choice]] = defaultdict(list)
    for choice in fitting:
        by_rail[here[choice.node_id].rail].append(choice)
    scopes += [members for members in by_rail.values() if len(members) >= nodes]
    best: tuple[tuple[int, int, int], GangChoice] | None = None
    for scope in scopes:
        taken = _fewest_racks(scope, nodes, here)
        racks = tuple(sorted({here[c.node_id].rack for c in taken}))
        rails = tuple(sorted({here[c.node_id].rail for c in taken}))
        ranks = sum(fitting.index(c) for c in taken)
        key = (len(racks), len(rails), ranks)
        if best is None or key < best[0]:
            members = tuple(sorted(taken, key=lambda c: c.node_id))
            best = (key, GangChoice(members, racks, rails))
    return best[1] if best else None


def _fewest_racks(scope: list[Choice], nodes: int, here: Mapping[str, Place]) -> list[Choice]:
    """`nodes` choices of `scope` (best first) in as few racks as they fit: one rack best
    fit when one holds them all, else the fullest racks first."""
    by_rack: dict[str, list[Choice]] = defaultdict(list)
    for choice in scope:
        by_rack[here[choice.node_id].rack].append(choice)
    whole = [members for members in by_rack.values() if len(members) >= nodes]
    if whole:
        return min(whole, key=lambda members: (len(members), members[0].score))[:nodes]
    taken: list[Choice] = []
    for members in sorted(by_rack.values(), key=lambda m: (-len(m), m[0].score)):
        taken += members[: nodes - len(taken)]
        if len(taken) == nodes:
            break
    return taken
