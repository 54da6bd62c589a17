"""The pure placer: NVLink preference, nvlink-all, packing, host share."""

from reservations.placement import Candidate, Group, Request, choose


def node(node_id, free_indexes, domains=(4, 4), vcpus_free=96, vcpus_per_gpu=12):
    """A node whose GPUs 0..n-1 sit in NVLink domains of the given sizes (1: no NVLink)."""
    groups, index = [], 0
    for number, size in enumerate(domains):
        members = [i for i in range(index, index + size) if i in set(free_indexes)]
        if size == 1:
            groups.extend(Group("", 1, (f"{node_id}-{i}",)) for i in members)
        else:
            groups.append(Group(f"nv{number}", size, tuple(f"{node_id}-{i}" for i in members)))
        index += size
    return Candidate(node_id=node_id, groups=tuple(groups), vcpus_free=vcpus_free,
                     memory_gib_free=10_000, vcpus_per_gpu=vcpus_per_gpu, memory_gib_per_gpu=1)


def indexes(choice):
    return sorted(int(device_id.rsplit("-", 1)[1]) for device_id in choice.device_ids)


def test_four_gpus_take_one_whole_domain_of_a_free_node():
    choice = choose([node("a", range(8))], Request(4))
    assert indexes(choice) == [0, 1, 2, 3]
    assert choice.vcpus == 48


def test_four_gpus_prefer_a_complete_domain_over_a_split():
    # Domain nv0 has 3 free (GPU 0 taken), nv1 all 4: take nv1 whole rather than split.
    choice = choose([node("a", [1, 2, 3, 4, 5, 6, 7])], Request(4))
    assert indexes(choice) == [4, 5, 6, 7]


def test_small_requests_fill_fragments_and_keep_whole_domains_whole():
    choice = choose([node("a", [1, 2, 3, 4, 5, 6, 7])], Request(2))
    assert indexes(choice) == [1, 2]


def test_any_topology_splits_when_it_must():
    choice = choose([node("a", [0, 1, 4, 5, 6])], Request(4))
    assert indexes(choice) == [0, 4, 5, 6]
    assert choice.score.domains_touched == 2


def test_nvlink_all_refuses_to_split_a_request_across_domains():
    assert choose([node("a", [0, 1, 4, 5, 6])], Request(4, topology="nvlink-all")) is None
    choice = choose([node("a", [0, 1, 4, 5, 6]), node("b", range(8))],
                    Request(4, topology="nvlink-all"))
    assert choice.node_id == "b"


def test_packing_prefers_the_node_with_least_room_left():
    choice = choose([node("a", range(8)), node("b", [4, 5, 6, 7])], Request(4))
    assert choice.node_id == "b"


def test_whole_domain_beats_packing():
    # b would be tighter, but only by splitting its free GPUs over two domains.
    choice = choose([node("a", range(8)), node("b", [2, 3, 6, 7])], Request(4))
    assert choice.node_id == "a"


def test_host_share_must_fit():
    assert choose([node("a", range(8), vcpus_free=40)], Request(4)) is None
    assert choose([node("a", range(8), vcpus_free=48)], Request(4)) is not None


def test_no_candidates_or_too_few_devices_is_none():
    assert choose([], Request(1)) is None
    assert choose([node("a", [0, 1])], Request(3)) is None
    assert choose([node("a", range(8))], Request(0)) is None


def test_devices_without_nvlink_are_singletons():
    choice = choose([node("a", range(4), domains=(1, 1, 1, 1))], Request(2))
    assert choice.score.domains_touched == 2
    assert choose([node("a", range(4), domains=(1, 1, 1, 1))],
                  Request(2, topology="nvlink-all")) is None


def test_the_choice_is_deterministic():
    nodes = [node(n, range(8)) for n in "dcba"]
    assert choose(nodes, Request(4)).node_id == "a"
