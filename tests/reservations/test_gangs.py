"""Gangs: a multi-node reservation is booked, bound and ended as one."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from audit.models import AuditEvent
from bcd.contract.crypto import canonical, public_pem, sign_bytes
from bcd.contract.holds import Hold
from compute.platform.events.models import Event
from fleet.models import Node, NodeSpec
from reservations.models import Allocation, Reservation
from reservations.services.binding import (
    allocation_bound_record,
    allocation_failed_record,
    reservation_bind,
)
from reservations.services.pending import pending_place
from reservations.services.release import reservation_expire
from tests.factories import make_node
from tests.reservations.conftest import HOUR, gpus, reserve
from tests.support.writes import assert_wrote


@pytest.fixture
def keyed(pool):
    """Make nodes with their own signing keys, in racks: {node id: key}."""
    keys: dict[str, ec.EllipticCurvePrivateKey] = {}

    def make(count: int, rack: str = "", rail: str = "leaf1") -> list[Node]:
        made = []
        for _ in range(count):
            place = {"topology": {"rack": rack, "rail": rail}} if rack else {}
            node = make_node(pool["id"], **place)
            key = ec.generate_private_key(ec.SECP256R1())
            Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
            keys[node.id] = key
            made.append(node)
        return made
    make.keys = keys  # type: ignore[attr-defined]
    return make


def book(root, pool, count, **extra) -> dict:
    return reserve(root, pool, count, **extra).result


def members(rsv: dict) -> list[Reservation]:
    return list(Reservation.objects.filter(gang_id=rsv["gang"]["id"]).order_by("gang_index"))


def live_nodes(gang: list[Reservation]) -> list[str]:
    return [a.node_id for m in gang for a in m.allocations.filter(ended_at__isnull=True)]


def report(keys, member: Reservation) -> tuple[str, str, str]:
    """The member's node's signed AllocationBound for the hold its spec names."""
    allocation = member.allocations.get(ended_at__isnull=True)
    spec = NodeSpec.objects.filter(node_id=allocation.node_id).latest("generation").spec
    hold = next(h for h in spec["allocations"] if h["allocationId"] == allocation.id)
    body = canonical({**Hold.from_wire(hold).binding(), "generation": 2,
                      "nodeId": allocation.node_id}).decode()
    return allocation.node_id, body, sign_bytes(keys[allocation.node_id], body.encode())


def binding_gang(root, pool, gpus: int, nodes: int) -> tuple[dict, list[Reservation]]:
    """A gang booked now, each member's hold sent to its node (binding)."""
    rsv = book(root, pool, gpus, nodes=nodes)
    gang = members(rsv)
    for member in gang:
        reservation_bind(reservation_id=member.id)
    return rsv, gang


def refuse_hold(keys, member: Reservation, reason: str) -> str:
    """The member's node says (signed) it could not hold it; the node's id."""
    allocation = member.allocations.get(ended_at__isnull=True)
    body = canonical({"allocationId": allocation.id, "nodeId": allocation.node_id,
                      "reason": reason}).decode()
    allocation_failed_record(node_id=allocation.node_id, body=body,
                             signature=sign_bytes(keys[allocation.node_id], body.encode()))
    return allocation.node_id


def test_a_gang_books_every_node_at_once_in_one_rack(root, pool, keyed):
    keyed(3, rack="r1")
    rack2 = keyed(4, rack="r2")
    rsv = book(root, pool, 8, nodes=4)
    assert rsv["state"] == "placed"
    assert (rsv["gang"]["nodes"], rsv["gang"]["state"], rsv["gang"]["index"]) == (4, "placed", 0)
    gang = members(rsv)
    assert [m.state for m in gang] == ["placed"] * 4
    assert sorted(live_nodes(gang)) == sorted(n.id for n in rack2)  # the rack that holds it
    assert len({(m.during.lower, m.during.upper) for m in gang}) == 1  # one window
    placed = Event.objects.filter(type="reservation.placed", subject__in=[m.id for m in gang])
    assert sorted(e.payload["gangId"] for e in placed) == [rsv["gang"]["id"]] * 4


def test_a_gang_that_does_not_fit_now_waits_whole_and_is_placed_whole(root, pool, keyed):
    keyed(3)
    single = book(root, pool, 8)
    rsv = book(root, pool, 8, nodes=3)
    assert rsv["state"] == "pending"
    assert "2 of the 3 nodes it needs" in rsv["failureReason"]
    assert live_nodes(members(rsv)) == []
    queue = root("reservations.queue", poolId=pool["id"])["items"]
    assert [(q["reservationId"], q["count"]) for q in queue] == [(rsv["id"], 24)]
    root("reservations.release", reservationId=single["id"])
    assert pending_place(pool_id=pool["id"]) == 1
    gang = members(rsv)
    assert [m.state for m in gang] == ["placed"] * 3
    assert len(set(live_nodes(gang))) == 3


def test_a_gang_larger_than_the_pool_is_refused_at_once(root, pool, keyed):
    keyed(2)
    answer = reserve(root, pool, 8, nodes=3)
    assert (answer.status, answer.code) == (409, "never_fits"), answer.body
    assert "a gang of 3 needs 3" in answer.message
    assert not Reservation.objects.exists()
    answer = root.call("reservations.create", poolId=pool["id"], duration=HOUR, nodes=2,
                       devices=[{"class": "gpu", "count": 8, "models": ["A100"]}])
    assert answer.status == 400
    assert answer.body["error"]["details"]["field"] == "devices"
    answer = reserve(root, pool, 8, nodes=65)
    assert answer.status == 400
    assert "nodes" in answer.message


def test_a_gang_is_active_only_once_every_node_reported(root, pool, keyed):
    keyed(3)
    rsv, gang = binding_gang(root, pool, 4, 3)
    for member in gang[:2]:
        node_id, body, signature = report(keyed.keys, member)
        with assert_wrote(audit="reservation.bound"):
            allocation_bound_record(node_id=node_id, body=body, signature=signature)
        assert root("reservations.get", reservationId=rsv["id"])["gang"]["state"] == "binding"
    assert [m.state for m in members(rsv)] == ["binding"] * 3
    node_id, body, signature = report(keyed.keys, gang[2])
    with assert_wrote(audit="reservation.activate", events=["reservation.active"] * 3):
        allocation_bound_record(node_id=node_id, body=body, signature=signature)
    assert [m.state for m in members(rsv)] == ["active"] * 3
    assert root("reservations.get", reservationId=gang[1].id)["gang"]["state"] == "active"


def test_a_member_whose_node_fails_is_placed_again_elsewhere(root, pool, keyed):
    keyed(3)
    spare = keyed(1)[0]
    rsv, gang = binding_gang(root, pool, 8, 3)
    node_id, body, signature = report(keyed.keys, gang[0])
    allocation_bound_record(node_id=node_id, body=body, signature=signature)
    refuse_hold(keyed.keys, gang[1], "cdi write failed")
    again = members(rsv)
    assert [m.state for m in again] == ["binding", "placed", "binding"]
    assert again[1].allocations.get(ended_at__isnull=True).node_id == spare.id
    assert again[1].during.upper == again[0].during.upper  # the gang's end
    reservation_bind(reservation_id=again[1].id)
    for member in again[1:]:
        node_id, body, signature = report(keyed.keys, member)
        allocation_bound_record(node_id=node_id, body=body, signature=signature)
    assert [m.state for m in members(rsv)] == ["active"] * 3


def test_when_no_node_is_left_for_a_member_the_whole_gang_is_placed_again(root, pool, keyed):
    keyed(2)
    rsv, gang = binding_gang(root, pool, 8, 2)
    refuse_hold(keyed.keys, gang[0], "gone")
    # No third node: the whole gang waits, nothing of it held, its holds gone from the specs.
    assert [m.state for m in members(rsv)] == ["pending", "pending"]
    assert not Allocation.objects.filter(reservation__gang_id=rsv["gang"]["id"],
                                         ended_at__isnull=True).exists()
    for node_id in keyed.keys:
        spec = NodeSpec.objects.filter(node_id=node_id).latest("generation").spec
        assert spec.get("allocations", []) == []


def test_ending_one_member_ends_the_gang(root, pool, keyed):
    keyed(3)
    rsv = book(root, pool, 4, nodes=3)
    gang = members(rsv)
    released = root("reservations.release", reservationId=gang[2].id)
    assert released["gang"]["state"] == "released"
    assert [m.state for m in members(rsv)] == ["released"] * 3
    assert live_nodes(members(rsv)) == []


def test_a_gang_expires_whole_whichever_member_is_due_first(root, pool, keyed):
    keyed(2)
    _rsv, gang = binding_gang(root, pool, 4, 2)
    rsv = {"gang": {"id": gang[0].gang_id}}
    for member in gang:
        node_id, body, signature = report(keyed.keys, member)
        allocation_bound_record(node_id=node_id, body=body, signature=signature)
    Reservation.objects.filter(pk__in=[m.id for m in gang]).update(during=(
        gang[0].during.lower.replace(year=2020), gang[0].during.upper.replace(year=2020)))
    reservation_expire(reservation_id=gang[1].id)
    assert [m.state for m in members(rsv)] == ["released"] * 2
    assert reservation_expire(reservation_id=gang[0].id) is None


def test_extending_a_gang_moves_every_member(root, pool, keyed):
    keyed(2)
    rsv = book(root, pool, 4, nodes=2)
    extended = root("reservations.extend", reservationId=rsv["gang"]["members"][1]["id"],
                    by=HOUR)
    ends = {m.during.upper for m in members(rsv)}
    assert len(ends) == 1
    assert extended["end"] is not None
    assert ends == {Reservation.objects.get(pk=rsv["id"]).during.upper}
    assert Reservation.objects.get(pk=rsv["id"]).duration_ms == 2 * HOUR


def test_the_preview_names_a_gangs_nodes_racks_and_rails(root, pool, keyed):
    keyed(2, rack="r1", rail="leaf1")
    rack2 = keyed(3, rack="r2", rail="leaf2")
    answer = root("capacity.preview", poolId=pool["id"], devices=gpus(8), duration=HOUR,
                  nodes=3)
    assert answer["fits"] is True
    assert (answer["racks"], answer["rails"]) == (["r2"], ["leaf2"])
    assert answer["placement"] == "one rack (r2), one rail (leaf2)"
    assert sorted(m["nodeId"] for m in answer["members"]) == sorted(n.id for n in rack2)
    assert all(len(m["devices"]) == 8 for m in answer["members"])
    answer = root("capacity.preview", poolId=pool["id"], devices=gpus(8), duration=HOUR,
                  nodes=4)
    assert answer["placement"] == "2 racks (r1, r2), 2 rails (leaf1, leaf2)"
    answer = root("capacity.preview", poolId=pool["id"], devices=gpus(8), duration=HOUR,
                  nodes=6)
    assert answer["fits"] is False
    assert answer["reason"] == "the pool has 5 machines with 8 GPUs; a gang of 6 needs 6"
    assert not Reservation.objects.exists()  # it only asked


def test_a_gang_at_its_earliest_waits_for_its_last_node(root, pool, keyed):
    keyed(3)
    busy = book(root, pool, 8, duration=2 * HOUR)
    asked = {"poolId": pool["id"], "devices": gpus(8), "duration": HOUR, "nodes": 3}
    earliest = root("capacity.earliest", **asked)
    assert earliest["found"] is True
    assert earliest["window"]["start"] == busy["end"]  # when the third node frees
    assert len({m["nodeId"] for m in earliest["members"]}) == 3
    rsv = book(root, pool, 8, nodes=3, atEarliest=True, duration=HOUR)
    gang = members(rsv)
    assert [m.state for m in gang] == ["placed"] * 3
    assert {m.during.lower for m in gang} == {row_of(busy).during.upper}
    answer = reserve(root, pool, 8, nodes=3, atEarliest=True, duration=HOUR,
                     before=busy["end"])
    assert (answer.status, answer.code) == (409, "capacity_conflict")  # none before it
    assert "no 3 nodes have 8 GPUs free together for 1h" in answer.message


def row_of(rsv: dict) -> Reservation:
    return Reservation.objects.get(pk=rsv["id"])


def test_a_waiting_gang_is_planned_whole_and_starts_earlier_when_nodes_free(root, keyed):
    from reservations.reconcilers import reconcile_pool
    from tests.conftest import POLICY

    site = root("sites.create", kind="shared", region="eu-1")
    planning = root("pools.create", siteId=site["id"], gpuModel="H100",
                    policy={**POLICY, "sharing": {"planStarts": True}},
                    **{"class": "metal-host"})
    for _ in range(2):
        make_node(planning["id"])
    busy = book(root, planning, 8, duration=2 * HOUR)
    rsv = book(root, planning, 8, nodes=2, duration=HOUR)
    assert rsv["state"] == "pending"
    reconcile_pool(planning["id"])
    gang = members(rsv)
    assert [(m.state, m.planned) for m in gang] == [("placed", True)] * 2
    assert {m.during.lower for m in gang} == {row_of(busy).during.upper}
    assert AuditEvent.objects.filter(target=rsv["id"], action="reservation.plan").count() == 1
    root("reservations.release", reservationId=busy["id"])
    reconcile_pool(planning["id"])
    gang = members(rsv)
    assert [m.state for m in gang] == ["placed"] * 2
    assert all(m.during.lower < row_of(busy).during.upper for m in gang)  # now, not later
    assert AuditEvent.objects.filter(target=rsv["id"],
                                     action="reservation.start_earlier").count() == 1


def test_an_eight_node_gang_goes_into_the_rack_that_has_room(root, pool, keyed):
    keyed(6, rack="r1", rail="leaf1")
    rack2 = keyed(9, rack="r2", rail="leaf1")
    keyed(12, rack="r3", rail="leaf2")
    rsv = book(root, pool, 8, nodes=8)
    nodes = live_nodes(members(rsv))
    assert len(set(nodes)) == 8
    assert set(nodes) <= {n.id for n in rack2}  # of the racks with room, the fullest
