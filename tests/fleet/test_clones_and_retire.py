"""A machine whose inventory is refused says why on the node itself; a node retired by an
operator (refused while anything holds it) hands its devices to the node that reports them."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from audit.models import AuditEvent
from bcd.contract.crypto import public_pem
from compute.platform.events.models import Event
from fleet.models import Device, Node
from fleet.reports import reconcile_reports
from fleet.services.sessions import reports_file
from tests.factories import inventory, make_bare_node, make_node, open_session
from tests.gateway.test_gateway_role import signed_report
from tests.reservations.conftest import reserve
from tests.support.writes import assert_wrote


def keyed_node(pool: dict) -> tuple[ec.EllipticCurvePrivateKey, Node]:
    key = ec.generate_private_key(ec.SECP256R1())
    node = make_bare_node(pool["id"])
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
    return key, node


def send_inventory(key: ec.EllipticCurvePrivateKey, node: Node, report: dict) -> None:
    """An inventory report as the node's agent sends it, filed by the gateway and applied
    by a worker (the path on which a refusal is recorded)."""
    epoch = open_session(node.id)
    reports_file(node_id=node.id, epoch=epoch, reports=[("inventory", signed_report(
        key, "inventory", node.id, epoch, json.dumps(report)))])
    reconcile_reports(node.id)


def condition(node: dict, kind: str) -> dict:
    [found] = [c for c in node["conditions"] if c["type"] == kind]
    return found


def test_a_clone_is_refused_and_the_node_says_why_until_the_first_is_retired(pool, root):
    report = inventory()
    first_key, first = keyed_node(pool)
    send_inventory(first_key, first, report)
    clone_key, clone = keyed_node(pool)
    with assert_wrote(audit="node.session.open", events=["node.connected"]):
        open_session(clone.id)
    send_inventory(clone_key, clone, report)
    shown = root("nodes.get", nodeId=clone.id)
    assert first.id in shown["inventoryRefused"]
    assert "nodes retire" in shown["inventoryRefused"]
    taken = condition(shown, "InventoryTaken")
    assert taken["status"] is False
    assert first.id in taken["reason"]
    assert "inventory refused" in condition(shown, "Schedulable")["reason"]
    assert condition(root("nodes.get", nodeId=first.id), "InventoryTaken")["status"] is True
    denied = AuditEvent.objects.filter(target=clone.id, action="node.inventory", allowed=False)
    assert denied.count() == 1
    assert first.id in denied.get().reason
    send_inventory(clone_key, clone, report)  # the agent reports again: audited, one event
    assert denied.count() == 2
    assert Event.objects.filter(type="node.inventory.refused", subject=clone.id).count() == 1
    assert not Device.objects.filter(node=clone).exists()

    epoch = Node.objects.get(pk=first.pk).session_epoch
    with assert_wrote(audit="node.retire", events=["node.retired"]):
        retired = root("nodes.retire", nodeId=first.id, reason="joined twice by mistake")
    assert retired["provisionState"] == "retired"
    assert retired["sessionEpoch"] == epoch + 1  # the gateway closes the session it holds
    send_inventory(clone_key, clone, report)
    shown = root("nodes.get", nodeId=clone.id)
    assert shown["inventoryRefused"] is None
    assert condition(shown, "InventoryTaken")["status"] is True
    assert Device.objects.filter(node=clone, present=True).count() == 8
    assert not Device.objects.filter(node=first).exists()


def test_a_retired_node_reports_nothing_more(pool, root):
    key, node = keyed_node(pool)
    send_inventory(key, node, inventory())
    root("nodes.retire", nodeId=node.id, reason="the machine is gone")
    send_inventory(key, node, inventory())
    assert "retired" in Node.objects.get(pk=node.pk).inventory_refused


def test_retire_is_refused_while_anything_holds_the_node(pool, root):
    node = make_node(pool["id"], gpus=8, domains=(8,))
    held = reserve(root, pool, 2)
    with assert_wrote(audit=None):
        refused = root.call("nodes.retire", nodeId=node.id, reason="oops")
    assert refused.code == "invalid_state"
    assert held.result["id"] in refused.message, refused.message
    root("reservations.release", reservationId=held.result["id"])
    root("nodes.retire", nodeId=node.id, reason="oops")
    with assert_wrote(audit=None):
        again = root.call("nodes.retire", nodeId=node.id, reason="twice")
    assert again.code == "invalid_state"
    assert "already retired" in again.message
    assert root("nodes.get", nodeId=node.id)["schedulable"] is False


@pytest.mark.parametrize("reason", ["", "x" * 301])
def test_retire_needs_a_reason(pool, root, reason):
    node = make_node(pool["id"])
    with assert_wrote(audit=None):
        answer = root.call("nodes.retire", nodeId=node.id, reason=reason)
    assert answer.code == "invalid_argument"
    assert "reason" in answer.message
