"""The gang placer packs a multi-node request into the fewest racks, then one rail."""

from __future__ import annotations

from reservations.gangplace import Place, choose_gang
from reservations.placement import Candidate, Group, Request


def node(node_id: str, free: int = 8) -> Candidate:
    devices = tuple(f"{node_id}-gpu{i}" for i in range(free))
    return Candidate(node_id, (Group(f"{node_id}-nv", 8, devices),))


def fleet(racks: dict[str, int], rail_of=lambda rack: "leaf1", free=None):
    """Candidates filling `racks` (name: node count), and each node's place."""
    candidates, places = [], {}
    for rack, count in racks.items():
        for index in range(count):
            node_id = f"{rack}-n{index:02d}"
            candidates.append(node(node_id, (free or {}).get(node_id, 8)))
            places[node_id] = Place(rack, rail_of(rack))
    return candidates, places


def test_an_eight_node_gang_goes_into_one_rack_when_one_has_room():
    candidates, places = fleet({"r1": 6, "r2": 9, "r3": 12})
    choice = choose_gang(candidates, Request(8), 8, places)
    assert choice is not None
    assert choice.racks == ("r2",)  # the best fit of the racks that hold it all
    assert len({m.node_id for m in choice.members}) == 8
    assert all(m.node_id.startswith("r2-") for m in choice.members)
    assert choice.summary() == "one rack (r2), one rail (leaf1)"


def test_without_a_rack_that_holds_it_the_fewest_racks_and_one_rail():
    rails = {"r1": "leaf1", "r2": "leaf2", "r3": "leaf2", "r4": "leaf1"}
    candidates, places = fleet({"r1": 5, "r2": 4, "r3": 4, "r4": 3}, rail_of=rails.get)
    choice = choose_gang(candidates, Request(8), 8, places)
    assert choice is not None
    # r1 + r4 (leaf1) and r2 + r3 (leaf2) both make two racks; r1 + r2 would need two rails.
    assert len(choice.racks) == 2
    assert len(choice.rails) == 1
    assert choice.racks in (("r1", "r4"), ("r2", "r3"))


def test_nodes_without_room_for_a_member_are_left_out():
    candidates, places = fleet({"r1": 8, "r2": 8}, free={"r1-n03": 2})
    choice = choose_gang(candidates, Request(8), 8, places)
    assert choice is not None
    assert choice.racks == ("r2",)
    assert choose_gang(candidates, Request(8), 16, places) is None  # 15 nodes fit
    assert choose_gang(candidates, Request(2), 16, places) is not None  # r1-n03 has 2


def test_unlabelled_nodes_are_one_rack_and_the_members_are_distinct_nodes():
    candidates = [node(f"n{i}") for i in range(4)]
    choice = choose_gang(candidates, Request(4), 4, {})
    assert choice is not None
    assert sorted(m.node_id for m in choice.members) == ["n0", "n1", "n2", "n3"]
    assert choice.summary() == "no rack labels, no rail labels"
    assert choose_gang(candidates, Request(4), 5, {}) is None
