"""Only the node can confirm what it holds: AllocationBound must carry its key's signature
and exactly the GPUs the ledger booked."""

from __future__ import annotations

from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from django.utils import timezone

from audit.models import AuditEvent
from bcd.contract.crypto import canonical, public_pem, sign_bytes
from bcd.contract.holds import Hold
from bcd.contract.signed import open_spec
from compute.platform.events.models import Event
from fleet.models import CommandState, Node, NodeCommand, NodeSpec
from fleet.pki import pki
from reservations.services.binding import (
    BindingRefused,
    StaleReport,
    allocation_bound_record,
    allocation_released_record,
    reservation_bind,
)
from tests.factories import make_node, make_unreachable, open_session
from tests.reservations.conftest import placed_and_started, reserve
from tests.support.writes import assert_wrote, recorded


@pytest.fixture
def bound(root, pool):
    """A node with its own key and a reservation in `binding` on it."""
    key = ec.generate_private_key(ec.SECP256R1())
    node = make_node(pool["id"])
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
    with assert_wrote(audit="reservation.create",
                      events=["reservation.placed", "reservation.binding"]):
        rsv = reserve(root, pool, 4).result  # its window starts now: bound by the same call
    spec = NodeSpec.objects.filter(node=node).latest("generation").spec
    return key, node, rsv, spec["allocations"][0]


def test_a_reservation_that_starts_later_is_bound_by_the_worker_at_its_start(root, pool):
    node = make_node(pool["id"])
    later = reserve(root, pool, 2, startIn=60_000).result
    assert later["state"] == "placed"
    assert reservation_bind(reservation_id=later["id"]) is None  # not yet
    rsv = placed_and_started(root, pool, 2)
    assert NodeSpec.objects.filter(node=node).count() == 1
    with assert_wrote(audit="reservation.bind", events=["reservation.binding"]):
        reservation_bind(reservation_id=rsv["id"])
    spec = NodeSpec.objects.filter(node=node).latest("generation")
    assert [a["reservationId"] for a in spec.spec["allocations"]] == [rsv["id"]]
    assert root("reservations.get", reservationId=rsv["id"])["state"] == "binding"


def report(key, node, hold, gpus=None):
    binding = Hold.from_wire({**hold, "gpus": gpus or hold["gpus"]}).binding()
    body = canonical({**binding, "generation": 2, "nodeId": node.id}).decode()
    return body, sign_bytes(key, body.encode())


def test_binding_puts_the_hold_in_the_next_spec_generation(root, bound):
    _, node, rsv, hold = bound
    assert root("reservations.get", reservationId=rsv["id"])["state"] == "binding"
    generations = list(NodeSpec.objects.filter(node=node).values_list("generation", flat=True))
    assert generations == [1, 2]
    assert len(hold["gpus"]) == 4


def test_a_forged_allocation_bound_is_rejected(root, bound):
    _, node, rsv, hold = bound
    gateway_key = ec.generate_private_key(ec.SECP256R1())  # anything but the node's key
    body, signature = report(gateway_key, node, hold)
    with pytest.raises(BindingRefused), assert_wrote(audit="reservation.activate", denied=True):
        allocation_bound_record(node_id=node.id, body=body, signature=signature)
    state = root("reservations.get", reservationId=rsv["id"])
    assert (state["state"], state["binding"]) == ("binding", None)
    refusal = AuditEvent.objects.filter(action="reservation.activate",
                                        allowed=False).latest("seq")
    assert "signed" in refusal.reason


def forged(case, key, node, hold, pool, root):
    """(signing node, body, signature) of a report that is not exactly the booking."""
    if case == "fewer GPUs":
        return (node, *report(key, node, hold, gpus=hold["gpus"][:3]))
    if case == "a superset":
        spare = next(d.uuid for d in node.devices.all() if d.uuid not in hold["gpus"])
        return (node, *report(key, node, hold, gpus=[*hold["gpus"], spare]))
    if case == "a GPU not booked":
        return (node, *report(key, node, hold, gpus=[*hold["gpus"][:3], "GPU-not-booked"]))
    if case == "another node's key":
        other_key = ec.generate_private_key(ec.SECP256R1())
        other = make_node(pool["id"])
        Node.objects.filter(pk=other.pk).update(public_key=public_pem(other_key.public_key()))
        return (node, *report(other_key, node, hold))
    assert case == "another allocation"
    other_rsv = reserve(root, pool, 4).result
    other_allocation = {**hold, "allocationId": other_rsv["allocationId"]}
    return (node, *report(key, node, other_allocation))


@pytest.mark.parametrize("case", ["fewer GPUs", "a superset", "a GPU not booked",
                                  "another node's key", "another allocation"])
def test_a_report_that_is_not_exactly_the_booking_leaves_it_unbound(root, pool, bound, case):
    key, node, rsv, hold = bound
    signer, body, signature = forged(case, key, node, hold, pool, root)
    with pytest.raises(BindingRefused), assert_wrote(audit="reservation.activate", denied=True):
        allocation_bound_record(node_id=signer.id, body=body, signature=signature)
    state = root("reservations.get", reservationId=rsv["id"])
    assert (state["state"], state["binding"]) == ("binding", None)


def test_the_nodes_signed_report_makes_it_active_once(root, bound):
    key, node, rsv, hold = bound
    body, signature = report(key, node, hold)
    with assert_wrote(audit="reservation.activate", events=["reservation.active"]):
        allocation_bound_record(node_id=node.id, body=body, signature=signature)
    with assert_wrote(audit=None):
        allocation_bound_record(node_id=node.id, body=body, signature=signature)  # a resend
    state = root("reservations.get", reservationId=rsv["id"])
    assert state["state"] == "active"
    assert state["binding"]["cdiDevices"] == sorted(f"bcd.dev/gpu={g}" for g in hold["gpus"])
    types = [e["type"] for e in root("events.list", types="reservation.*")["items"]]
    assert types == ["reservation.placed", "reservation.binding", "reservation.active"]
    released = root("reservations.release", reservationId=rsv["id"])
    assert released["state"] == "released"
    with pytest.raises(StaleReport), assert_wrote(audit=None):  # said again after the release
        allocation_bound_record(node_id=node.id, body=body, signature=signature)
    assert root("reservations.get", reservationId=rsv["id"])["state"] == "released"
    body = canonical({"allocationId": hold["allocationId"], "generation": 3,
                      "nodeId": node.id}).decode()
    with assert_wrote(audit="allocation.release", events=["allocation.released"]):
        allocation_released_record(node_id=node.id, body=body,
                                   signature=sign_bytes(key, body.encode()))
    latest = NodeSpec.objects.filter(node=node).latest("generation")
    assert (latest.generation, latest.spec) == (3, {"allocations": [], "vms": []})


def test_unanswered_commands_are_redelivered_to_the_same_journal_only(pool):
    node = make_node(pool["id"])
    open_session(node.id, 111)
    command = NodeCommand.objects.create(node=node, kind="diag.disk", state=CommandState.SENT)
    with assert_wrote(audit="node.session.open"):
        open_session(node.id, 111)  # same journal: deliver again
    command.refresh_from_db()
    assert command.state == CommandState.QUEUED
    NodeCommand.objects.filter(pk=command.pk).update(state=CommandState.SENT)
    with assert_wrote(audit="node.session.open", events=["node.journal.lost"]):
        open_session(node.id, 222)  # journal lost: never again
    command.refresh_from_db()
    assert command.state == CommandState.UNKNOWN
    assert Node.objects.get(pk=node.pk).journal_epoch == 222


def test_a_command_queued_again_after_a_lost_session_is_never_run_by_a_new_journal(pool):
    """Sent to journal 111, queued again when a session of the same journal reopened but
    never taken: the journal that may have run it is gone, so journal 222 never gets it; a
    command never sent still goes to the new journal."""
    node = make_node(pool["id"])
    open_session(node.id, 111)
    sent = NodeCommand.objects.create(node=node, kind="diag.disk", state=CommandState.SENT,
                                      sent_at=timezone.now())
    fresh = NodeCommand.objects.create(node=node, kind="diag.disk")
    open_session(node.id, 111)
    sent.refresh_from_db()
    assert sent.state == CommandState.QUEUED
    with assert_wrote(audit="node.session.open", events=["node.journal.lost"]):
        open_session(node.id, 222)
    sent.refresh_from_db()
    fresh.refresh_from_db()
    assert (sent.state, fresh.state) == (CommandState.UNKNOWN, CommandState.QUEUED)


def test_a_node_ahead_of_a_restored_ledger_gets_its_spec_above_its_own(bound):
    """The ledger went back to an earlier point: the node's journal applied generation 9,
    the ledger's newest is 2. Recording the session writes the ledger's spec as generation
    10 (once), and the hold the ledger never booked comes back released, with why."""
    key, node, _rsv, _hold = bound
    ledger = NodeSpec.objects.filter(node=node).latest("generation")
    with assert_wrote(audit="node.session.open", events=["node.spec.rebased"]):
        open_session(node.id, 111, journal_generation=9)
    rebased = NodeSpec.objects.filter(node=node).latest("generation")
    assert (rebased.generation, rebased.spec) == (10, ledger.spec)
    pin = pki().pins()["joinSigningKeyPin"]  # signed for generation 10, as its node checks
    assert open_spec(rebased.signed, pin=pin, node_id=node.id, generation=10) == ledger.spec
    event = Event.objects.get(type="node.spec.rebased", subject=node.id)
    assert event.payload == {"poolId": node.pool_id, "journalGeneration": 9,
                             "ledgerGeneration": ledger.generation, "generation": 10}
    for journal in (9, 10):  # the same news again, then a node that is not ahead
        with assert_wrote(audit="node.session.open"):
            open_session(node.id, 111, journal_generation=journal)
    assert NodeSpec.objects.filter(node=node).latest("generation").generation == 10

    body = canonical({"allocationId": "alloc_01never0booked0here000000", "generation": 10,
                      "nodeId": node.id}).decode()
    with assert_wrote(audit="allocation.release", events=["allocation.released"]):
        allocation_released_record(node_id=node.id, body=body,
                                   signature=sign_bytes(key, body.encode()))
    row = AuditEvent.objects.filter(action="allocation.release").latest("seq")
    assert "the ledger has no such allocation" in row.reason


def test_a_generation_no_node_could_have_applied_is_refused(pool):
    from fleet.services.sessions import MAX_GENERATION, session_change_record

    node = make_node(pool["id"])
    epoch = open_session(node.id)
    with pytest.raises(ValueError, match="generations"), assert_wrote(audit=None):
        session_change_record(node_id=node.id, epoch=epoch, change={
            "change": "open", "was": "connected", "journalGeneration": MAX_GENERATION,
            "ledgerGeneration": 1})
    assert NodeSpec.objects.filter(node=node).latest("generation").generation == 1


def signed_failure(key, node, hold, reason="device-missing"):
    body = canonical({"allocationId": hold["allocationId"], "generation": 2,
                      "nodeId": node.id, "reason": reason}).decode()
    return body, sign_bytes(key, body.encode())


def test_a_failed_hold_is_placed_again_elsewhere_at_most_twice(root, pool, acme):
    from reservations.models import Quota, Reservation
    from reservations.services.binding import allocation_failed_record

    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    keys = {}
    for _ in range(3):
        key = ec.generate_private_key(ec.SECP256R1())
        node = make_node(pool["id"])
        Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
        keys[node.id] = key
    rsv = reserve(acme, pool, 4).result
    nodes_tried = []
    for attempt in range(3):
        current = Reservation.objects.get(pk=rsv["id"])
        if attempt:  # placed again elsewhere: the worker binds it
            assert current.state == "placed", attempt
            reservation_bind(reservation_id=rsv["id"])
        else:  # bound by the create call
            assert current.state == "binding"
        allocation = current.allocations.get(ended_at__isnull=True)
        node = Node.objects.get(pk=allocation.node_id)
        nodes_tried.append(node.id)
        hold = NodeSpec.objects.filter(node=node).latest("generation").spec["allocations"][0]
        body, signature = signed_failure(keys[node.id], node, hold)
        with recorded() as written:
            allocation_failed_record(node_id=node.id, body=body, signature=signature)
        assert written.audit == ["reservation.binding_fail"]
        assert written.events[0] == "reservation.binding_failed"
        assert written.events[1:] == (["reservation.placed"] if attempt < 2
                                      else ["reservation.failed"])
        assert hold["allocationId"] not in str(
            NodeSpec.objects.filter(node=node).latest("generation").spec)
    final = Reservation.objects.get(pk=rsv["id"])
    assert final.state == "failed"
    assert "device-missing" in final.failure_reason
    assert len(set(nodes_tried)) == 3  # never a node that already failed it
    assert Quota.objects.get(tenant__slug="acme").used == 0
    assert not final.allocations.filter(ended_at__isnull=True).exists()
    types = [e["type"] for e in acme("events.list", types="reservation.*")["items"]]
    assert types.count("reservation.binding_failed") == 3
    assert types[-1] == "reservation.failed"
    assert acme("usage.list")["items"] == []  # GPUs never held are never metered


def test_no_report_within_the_timeout_counts_as_a_failure(root, pool, bound):
    from django.db import connection

    from compute.platform.queue.models import WorkItem
    from reservations.reconcilers import reconcile_reservation, sweep

    _, node, rsv, _ = bound
    make_node(pool["id"])  # somewhere else to go
    with connection.cursor() as cursor:  # six minutes pass, the node connected throughout
        cursor.execute("UPDATE reservations_reservation SET binding_started_at = now() - "
                       "interval '6 minutes' WHERE id = %s", [rsv["id"]])
        cursor.execute("UPDATE fleet_node SET connected_at = now() - interval '1 hour' "
                       "WHERE id = %s", [node.id])
    sweep()
    assert WorkItem.objects.filter(kind="reservation", key=rsv["id"]).exists()
    reconcile_reservation(rsv["id"])
    again = root("reservations.get", reservationId=rsv["id"])
    assert again["state"] == "placed"
    assert again["nodeId"] != node.id
    assert again["failureReason"] == "no AllocationBound within the timeout"


def test_a_binding_waits_while_its_node_is_unreachable_and_gets_the_whole_timeout_back(
        root, pool, bound):
    """A node cut off past the binding timeout keeps its binding (nothing moves for a
    node's silence alone); back, it has the whole timeout again to report the hold."""
    from django.db import connection

    from compute.platform.queue.models import WorkItem
    from fleet.services.sessions import node_reconnect
    from reservations.reconcilers import reconcile_reservation, sweep

    _, node, rsv, _ = bound
    make_node(pool["id"])  # somewhere else it could go

    def binding_began_minutes_ago(minutes: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE reservations_reservation SET binding_started_at = now() - "
                           "make_interval(mins => %s) WHERE id = %s", [minutes, rsv["id"]])

    def swept_and_reconciled() -> dict:
        WorkItem.objects.filter(kind="reservation", key=rsv["id"]).delete()
        sweep()
        if WorkItem.objects.filter(kind="reservation", key=rsv["id"]).exists():
            reconcile_reservation(rsv["id"])
        return root("reservations.get", reservationId=rsv["id"])

    make_unreachable(node)
    binding_began_minutes_ago(60)
    reconcile_reservation(rsv["id"])  # even when asked directly
    assert swept_and_reconciled()["state"] == "binding"
    node_reconnect(node_id=node.id, epoch=Node.objects.get(pk=node.id).session_epoch)
    assert swept_and_reconciled()["state"] == "binding"  # back: the timeout starts again
    Node.objects.filter(pk=node.id).update(connected_at=timezone.now() - timedelta(minutes=6))
    again = swept_and_reconciled()  # connected the whole timeout, and still no report
    assert (again["state"], again["nodeId"] != node.id) == ("placed", True)
    assert again["failureReason"] == "no AllocationBound within the timeout"


def window_ended_a_second_ago(reservation_id):
    """Move a reservation's window (and its bookings') to have ended a second ago."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table, column in (("reservations_reservation", "id"),
                              ("reservations_booking", "allocation_id")):
            cursor.execute(
                f"UPDATE {table} SET during = tstzrange(now() - interval '2 hours', "  # noqa: S608
                f"now() - interval '1 second') WHERE {column} IN (SELECT %s UNION SELECT id "
                "FROM reservations_allocation WHERE reservation_id = %s)",
                [reservation_id, reservation_id])


def test_a_reservation_that_starts_where_an_ended_one_still_holds_binds_alone(root, pool):
    """Its node's spec never holds both: the ended one is released before the bind (the
    node would refuse the new hold as an overlap, and the reservation be placed again)."""

    from reservations.reconcilers import reconcile_reservation

    node = make_node(pool["id"])
    ended = reserve(root, pool, 8).result
    reservation_bind(reservation_id=ended["id"])
    window_ended_a_second_ago(ended["id"])  # and nobody expired it
    starting = reserve(root, pool, 8).result
    assert (starting["state"], starting["nodeId"]) == ("placed", node.id)
    reconcile_reservation(starting["id"])
    spec = NodeSpec.objects.filter(node=node).latest("generation").spec
    assert [hold["reservationId"] for hold in spec["allocations"]] == [starting["id"]]
    assert root("reservations.get", reservationId=ended["id"])["state"] == "released"
    assert root("reservations.get", reservationId=starting["id"])["state"] == "binding"


def test_a_binding_waits_while_its_node_still_holds_what_ended_on_those_gpus(root, pool):
    """The ended one was not released (its expiry skipped a row another transaction had
    locked): binding now would give the node a spec holding the GPUs twice, which it
    refuses as an overlap. The binding waits, and goes ahead once the release is in."""

    from reservations.services.release import reservation_expire

    node = make_node(pool["id"])
    ended = reserve(root, pool, 8).result
    reservation_bind(reservation_id=ended["id"])
    window_ended_a_second_ago(ended["id"])
    starting = reserve(root, pool, 8).result
    before = NodeSpec.objects.filter(node=node).latest("generation").generation
    assert reservation_bind(reservation_id=starting["id"]) is None
    assert NodeSpec.objects.filter(node=node).latest("generation").generation == before
    assert root("reservations.get", reservationId=starting["id"])["state"] == "placed"
    reservation_expire(reservation_id=ended["id"])
    assert reservation_bind(reservation_id=starting["id"]).state == "binding"
    spec = NodeSpec.objects.filter(node=node).latest("generation").spec
    assert [hold["reservationId"] for hold in spec["allocations"]] == [starting["id"]]


def test_i3_tells_what_is_on_its_way_from_what_diverged(root, bound):
    """A binding or a release younger than the settle time is on its way; older, or an
    active reservation its node does not hold, is a divergence the simulator reports."""
    from datetime import timedelta

    from compute.core.db import database_now
    from reservations.invariants import unconverged

    key, node, rsv, hold = bound
    settle, later = timedelta(seconds=10), timedelta(seconds=11)
    assert unconverged({}, database_now(), settle) == []
    (late,) = unconverged({}, database_now() + later, settle)
    assert late.startswith(f"{rsv['id']} is still binding on {node.id}")
    body, signature = report(key, node, hold)
    allocation_bound_record(node_id=node.id, body=body, signature=signature)
    held = {node.id: {hold["allocationId"]: {"reservation": rsv["id"], "gpus": hold["gpus"]}}}
    assert unconverged(held, database_now(), settle) == []
    assert unconverged({}, database_now(), settle) == [
        f"{rsv['id']} is active but {node.id} holds nothing for it"]
    wrong = {node.id: {hold["allocationId"]: {"reservation": rsv["id"],
                                              "gpus": hold["gpus"][:1]}}}
    (other,) = unconverged(wrong, database_now(), settle)
    assert "which holds" in other
    root("reservations.release", reservationId=rsv["id"])
    assert unconverged(held, database_now(), settle) == []  # the node is giving it back
    (kept,) = unconverged(held, database_now() + later, settle)
    assert kept.startswith(f"{node.id} holds {hold['allocationId']}")


def test_a_fence_pools_hold_says_so_and_the_stopped_workloads_reach_the_audit_and_events(
        root, acme, pool):
    root("pools.update", poolId=pool["id"], policy={
        **root("pools.get", poolId=pool["id"])["policy"], "onEnd": "fence",
        "fenceGraceSeconds": 5, "endingNotices": [600]})
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    key = ec.generate_private_key(ec.SECP256R1())
    node = make_node(pool["id"])
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
    rsv = reserve(acme, pool, 2).result
    reservation_bind(reservation_id=rsv["id"])
    [wire] = NodeSpec.objects.filter(node=node).latest("generation").spec["allocations"]
    hold = Hold.from_wire(wire)
    assert (hold.on_end, hold.fence_grace, hold.notices) == ("fence", 5.0, (600.0,))
    body = canonical({"allocationId": hold.allocation_id, "generation": 3, "nodeId": node.id,
                      "workloads": {"onEnd": "fence", "graceSeconds": 5, "survived": [],
                                    "stopped": [{"pid": 4242, "command": "python train.py",
                                                 "why": "device /dev/nvidia0",
                                                 "signal": "SIGKILL"}]}}).decode()
    with assert_wrote(audit="allocation.release",
                      events=["allocation.released", "allocation.released"]):
        allocation_released_record(node_id=node.id, body=body,
                                   signature=sign_bytes(key, body.encode()))
    stopped = [{"pid": 4242, "command": "python train.py", "why": "device /dev/nvidia0",
                "signal": "SIGKILL"}]
    row = AuditEvent.objects.get(action="allocation.release", target=hold.allocation_id)
    assert row.data["workloads"]["stopped"] == stopped
    for client in (root, acme):  # the pool's owner and the reservation's tenant
        [event] = client("events.list", types="allocation.released")["items"]
        assert event["payload"]["workloads"]["stopped"] == stopped
        assert event["payload"]["reservationId"] == rsv["id"]
