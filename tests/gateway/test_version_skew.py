"""Agents one minor release behind the control plane keep their sessions through an upgrade;
older ones (and ones newer than the control plane) are refused with their reason, shown on
the node, through a real gateway."""

from __future__ import annotations

import asyncio

import grpc
import pytest

import bcd.session
from bcd.contract.version import agent_refusal, release, version
from fleet.models import Node
from fleet.services.sessions import session_changes_pending
from tests.gateway.conftest import diag, join_through_gateway, session_for
from tests.support.waiting import eventually, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(("agent", "current", "taken"), [
    ("0.5.0", "0.5.2", True), ("0.5.7", "0.5.2", True), ("0.4.9", "0.5.2", True),
    ("0.4.0rc1", "0.5.0", True), ("0.3.9", "0.5.2", False), ("0.6.0", "0.5.2", False),
    ("1.5.0", "2.5.0", False), ("bcd-py", "0.2.0", True), ("bcd-py", "0.3.0", False),
    ("", "0.2.0", False), ("banana", "0.2.0", False), ("2.0.1", "2.0.0", True),
    ("1.9.0", "2.0.0", False),
])
def test_the_current_and_previous_minor_release_are_taken(agent, current, taken):
    assert (agent_refusal(agent, current=current) == "") is taken


def test_a_refusal_says_why_and_what_to_do():
    assert "older than this control plane (0.5.2) takes (bcd 0.4 or 0.5); upgrade bcd" in \
        agent_refusal("0.3.1", current="0.5.2")
    assert "upgrade the control plane first" in agent_refusal("0.6.0", current="0.5.2")


def connect(fleet, credentials, inventory, agent_version):
    """How one session of an agent saying `agent_version` goes: ("connected", epoch) or
    (its gRPC status, its details)."""

    async def attempt():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        session.agent_version = agent_version
        task = asyncio.create_task(session.run())
        try:
            if await eventually(lambda: session.state.connected or task.done(), timeout=30):
                if session.state.connected:
                    return "connected", session.state.epoch
                task.result()
            return "ended", ""
        except grpc.aio.AioRpcError as error:
            return error.code().name, error.details()
        finally:
            task.cancel()

    return asyncio.run(attempt())


def releases() -> tuple[str, str]:
    """The previous minor release of this one, and the one before that."""
    ours = release(version())
    assert ours is not None
    assert ours[1] >= 2, version()
    return f"{ours[0]}.{ours[1] - 1}.7", f"{ours[0]}.{ours[1] - 2}.3"


def joined(fleet):
    from bcd.inventory.fake import SimulatedInventory

    token = fleet.api("joinTokens.create", poolId=fleet.pool["id"], ttl=3_600_000)["token"]
    inventory = SimulatedInventory("gpu-skew")
    credentials, payload = asyncio.run(join_through_gateway(fleet, token, inventory))
    return credentials, payload["nodeId"], inventory


def test_an_agent_of_the_previous_minor_release_is_taken_and_shown(fleet):
    previous, _older = releases()
    credentials, node_id, inventory = joined(fleet)
    assert connect(fleet, credentials, inventory, previous)[0] == "connected"
    listed = fleet.api("nodes.list", poolId=fleet.pool["id"])["items"]
    assert [(n["id"], n["agentVersion"]) for n in listed] == [(node_id, previous)]
    assert connect(fleet, credentials, inventory, version())[0] == "connected"
    assert fleet.api("nodes.get", nodeId=node_id)["agentVersion"] == version()
    assert wait_until(lambda: not session_changes_pending(node_id), 10)
    opened = fleet.api("audit.list", action="node.session.open", target=node_id)["items"]
    assert [row["data"]["agentVersion"] for row in opened] == [previous, version()]


def test_a_previous_agent_without_a_version_in_its_hello_is_taken(fleet, monkeypatch):
    """Agents of 0.1 say "bcd-py" and no protocol revision: taken while 0.1 is the previous
    minor release (the field they do not send reads as 0)."""
    if agent_refusal("bcd-py", current=version()):
        pytest.skip(f"0.1 agents are no longer taken by {version()}")
    monkeypatch.setattr(bcd.session, "PROTOCOL", 0)
    credentials, node_id, inventory = joined(fleet)
    assert connect(fleet, credentials, inventory, "bcd-py")[0] == "connected"
    assert Node.objects.get(pk=node_id).agent_version == "bcd-py"


def test_an_older_agent_is_refused_with_its_reason_until_it_is_upgraded(fleet):
    _previous, older = releases()
    credentials, node_id, inventory = joined(fleet)
    status, details = connect(fleet, credentials, inventory, older)
    assert status == "FAILED_PRECONDITION"
    assert f"agent {older} is older than this control plane" in details
    node = fleet.api("nodes.get", nodeId=node_id)
    assert (node["agentVersion"], node["agentRefused"]) == (older, details)
    assert node["sessionEpoch"] == 0
    assert node["connectivity"] != "connected"
    supported = {c["type"]: c for c in node["conditions"]}["AgentSupported"]
    assert (supported["status"], supported["reason"]) == (False, details)
    # Retrying with the same version is refused again, and recorded once.
    assert connect(fleet, credentials, inventory, older)[0] == "FAILED_PRECONDITION"
    assert wait_until(lambda: not session_changes_pending(node_id), 10)
    events = fleet.api("nodes.events", nodeId=node_id)["items"]
    refused = [e for e in events if e["type"] == "node.agent.refused"]
    assert [(e["payload"]["agentVersion"], e["payload"]["reason"]) for e in refused] == \
        [(older, details)]
    rows = fleet.api("audit.list", action="node.session.refuse", target=node_id)["items"]
    assert [(row["actorId"], row["data"]["reason"]) for row in rows] == [("gateway", details)]
    # The upgraded agent is taken and the refusal is gone from the node.
    assert connect(fleet, credentials, inventory, version())[0] == "connected"
    node = fleet.api("nodes.get", nodeId=node_id)
    assert (node["agentVersion"], node["agentRefused"]) == (version(), None)


def test_an_agent_newer_than_the_control_plane_is_refused(fleet):
    ours = release(version())
    newer = f"{ours[0]}.{ours[1] + 1}.0"
    credentials, node_id, inventory = joined(fleet)
    status, details = connect(fleet, credentials, inventory, newer)
    assert (status, "upgrade the control plane first" in details) == ("FAILED_PRECONDITION",
                                                                       True)
    assert Node.objects.get(pk=node_id).agent_refused == details
