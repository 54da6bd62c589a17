"""The gateway's write services, called directly: each is one transaction with one audit
row, and a session's epoch in the database decides whether it may still act."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from django.utils import timezone

from bcd.contract.crypto import public_pem, sign_bytes
from compute.platform.events.models import Event
from fleet.models import Connectivity, Node, NodeCommand
from fleet.reports import reconcile_reports
from fleet.services.sessions import (
    StaleSession,
    command_result_record,
    inventory_report_record,
    node_mark_unreachable,
    node_reconnect,
    session_open,
)
from tests.factories import inventory, lapse_lease, make_bare_node, make_node, open_session
from tests.support.writes import assert_wrote


def signed_result(key, command_id, status="succeeded", output=None):
    body = json.dumps(output or {"healthyGpus": 8})
    return {"command_id": command_id, "status": status, "body": body,
            "signature": sign_bytes(key, f"{command_id}\n{status}\n{body}".encode())}


@pytest.fixture
def keyed(pool):
    """A joined node with its own key, in `adopting` (the pool asks for diag.nvml)."""
    key = ec.generate_private_key(ec.SECP256R1())
    node = make_bare_node(pool["id"])
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
    return key, node


def test_an_older_sessions_reports_are_refused_by_the_database(keyed):
    key, node = keyed
    first = open_session(node.id)
    inventory_report_record(node_id=node.id, epoch=first, report_id="inv-1",
                            body=json.dumps(inventory()))
    command = NodeCommand.objects.get(node=node, kind="diag.nvml")
    second = open_session(node.id)  # the node reconnected: epoch 1 may not act
    assert second == first + 1
    with pytest.raises(StaleSession), assert_wrote(audit=None):
        inventory_report_record(node_id=node.id, epoch=first, report_id="inv-2",
                                body=json.dumps(inventory()))
    with pytest.raises(StaleSession), assert_wrote(audit=None):
        command_result_record(node_id=node.id, epoch=first, report_id="res-1",
                              **signed_result(key, command.id))
    node.refresh_from_db()
    assert (node.inventory_generation, node.provision_state) == (1, "adopting")
    command.refresh_from_db()
    assert command.state == "queued"
    with assert_wrote(audit="node.command.result", events=["node.adopted"]):
        assert command_result_record(node_id=node.id, epoch=second, report_id="res-2",
                                     **signed_result(key, command.id))


def test_a_report_is_claimed_with_its_write_and_a_resend_changes_nothing(keyed):
    _, node = keyed
    epoch = open_session(node.id)
    body = json.dumps(inventory())
    with assert_wrote(audit="node.inventory",
                      events=["node.inventory.updated", "node.acceptance.started"]):
        assert inventory_report_record(node_id=node.id, epoch=epoch, report_id="inv-1",
                                       body=body) is True
    with assert_wrote(audit=None):
        assert inventory_report_record(node_id=node.id, epoch=epoch, report_id="inv-1",
                                       body=body) is False
    assert Node.objects.get(pk=node.pk).inventory_generation == 1


def test_a_result_not_signed_by_the_node_is_refused(keyed):
    _, node = keyed
    epoch = open_session(node.id)
    inventory_report_record(node_id=node.id, epoch=epoch, report_id=secrets.token_hex(4),
                            body=json.dumps(inventory()))
    command = NodeCommand.objects.get(node=node, kind="diag.nvml")
    forger = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(PermissionError), assert_wrote(audit=None):
        command_result_record(node_id=node.id, epoch=epoch, report_id="res-1",
                              **signed_result(forger, command.id))


def test_liveness_turns_a_quiet_node_unreachable_and_a_heartbeat_brings_it_back(pool):
    node = make_node(pool["id"])
    epoch = open_session(node.id)
    with assert_wrote(audit="node.unreachable", events=["node.unreachable"]):
        assert lapse_lease(node.id) is not None
    with assert_wrote(audit="node.reconnect", events=["node.reconnected"]):
        assert node_reconnect(node_id=node.id, epoch=epoch) is True
        reconcile_reports(node.id)  # the worker records what the gateway filed
    with assert_wrote(audit=None):
        assert node_reconnect(node_id=node.id, epoch=epoch) is False  # already connected
        reconcile_reports(node.id)
    with pytest.raises(StaleSession):
        node_reconnect(node_id=node.id, epoch=epoch - 1)


def test_liveness_waits_for_the_sessions_the_gateway_filed_so_events_keep_their_order(pool):
    """A node connects and falls silent before a worker has recorded its session: its
    lease running out must not be written before its connection."""
    node = make_node(pool["id"])
    Node.objects.filter(pk=node.pk).update(connectivity=Connectivity.UNKNOWN)
    session_open(node_id=node.id, journal_epoch=0)  # filed by the gateway, not yet recorded
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    with assert_wrote(audit=None):
        assert node_mark_unreachable(node_id=node.id) is None
    reconcile_reports(node.id)
    assert node_mark_unreachable(node_id=node.id) is not None
    types = [e.type for e in Event.objects.filter(subject=node.id).order_by("seq")]
    assert types[-2:] == ["node.connected", "node.unreachable"]


def test_a_node_says_every_reason_it_is_not_schedulable(pool, root):
    from fleet.presenters import unschedulable_because
    from tests.factories import make_unreachable

    node = make_node(pool["id"])
    assert unschedulable_because(node) == "ok"
    with assert_wrote(audit="node.cordon", events=["node.cordoned"]):
        root("nodes.cordon", nodeId=node.id)
    with assert_wrote(audit=None):  # already cordoned: nothing changes, nothing is written
        root("nodes.cordon", nodeId=node.id)
    make_unreachable(node)
    node.refresh_from_db()
    assert unschedulable_because(node) == "cordoned; unreachable"


def test_uncordon_and_adopt_again_write_one_row_each(pool, root):
    node = make_node(pool["id"])
    root("nodes.cordon", nodeId=node.id)
    with assert_wrote(audit="node.uncordon", events=["node.uncordoned"]):
        root("nodes.uncordon", nodeId=node.id)
    Node.objects.filter(pk=node.pk).update(provision_state="acceptance-failed")
    with assert_wrote(audit="node.adopt", events=["node.acceptance.started"]):
        root("nodes.adopt", nodeId=node.id, reason="GPU 3 reseated")
    with assert_wrote(audit=None):  # not failed any more: refused, nothing written
        assert root.call("nodes.adopt", nodeId=node.id, reason="again").code == \
            "invalid_state"


def test_a_backlog_of_gpu_readings_is_thinned_to_the_newest_and_nothing_else_waits(keyed):
    """Readings that a newer reading of the same node follows are verified, not applied (and
    counted); one its node did not sign is refused and audited all the same; the node's
    other reports in between are applied, in order."""
    from prometheus_client import REGISTRY

    from audit.models import AuditEvent
    from bcd.contract.reports import statement
    from fleet.models import GpuSample, NodeReport, ReportInbox

    key, node = keyed
    epoch = open_session(node.id)
    wire = inventory()
    uuids = [gpu["uuid"] for gpu in wire["gpus"]]

    def filed(kind: str, body: str, signer: ec.EllipticCurvePrivateKey = key) -> str:
        report_id = secrets.token_hex(8)
        ReportInbox.objects.create(node=node, epoch=epoch, kind=kind, fields={
            "reportId": report_id, "body": body, "reportSignature": sign_bytes(
                signer, statement(kind=kind, report_id=report_id, epoch=epoch, body=body))})
        return report_id

    def reading(utilization: int) -> str:
        return json.dumps({"gpus": {uuid: {"utilization": utilization, "memoryUsedMiB": 1}
                                    for uuid in uuids}})

    superseded = REGISTRY.get_sample_value("bc_telemetry_superseded_total") or 0.0
    forger = ec.generate_private_key(ec.SECP256R1())
    older = [filed("telemetry", reading(10)), filed("telemetry", reading(15), forger),
             filed("telemetry", reading(20))]
    inventoried = filed("inventory", json.dumps(wire))
    newest = filed("telemetry", reading(30))
    reconcile_reports(node.id)

    assert not ReportInbox.objects.filter(node=node).exists()
    assert NodeReport.objects.filter(report_id=inventoried, kind="inventory").exists()
    assert Node.objects.get(pk=node.pk).inventory_generation == 1
    assert NodeReport.objects.filter(report_id=newest, kind="telemetry").exists()
    assert not NodeReport.objects.filter(report_id__in=older).exists()
    samples = GpuSample.objects.filter(device__node=node)
    assert sorted(samples.values_list("utilization", flat=True)) == [30] * len(uuids)
    assert REGISTRY.get_sample_value("bc_telemetry_superseded_total") == superseded + 2
    refused = AuditEvent.objects.filter(allowed=False, target=node.id, action="node.report")
    assert [older[1] in reason for reason in refused.values_list("reason", flat=True)] == [True]
