"""Join and session through a real gateway over TLS and mTLS, against a live API."""

from __future__ import annotations

import asyncio
import time

import pytest

from bcd.inventory.fake import SimulatedInventory
from fleet.models import Node
from tests.gateway.conftest import diag, join_through_gateway, session_for

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_node_joins_through_the_gateway_and_is_adopted(fleet):
    token = fleet.api("joinTokens.create", poolId=fleet.pool["id"], ttl=3_600_000)["token"]
    inventory = SimulatedInventory("gpu-01")

    async def scenario():
        credentials, payload = await join_through_gateway(fleet, token, inventory)
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run(on_welcome=lambda s: session.send_inventory()))
        for _ in range(200):
            await asyncio.sleep(0.1)
            state = await asyncio.to_thread(
                lambda: Node.objects.get(pk=payload["nodeId"]).provision_state)
            if state == "adopted":
                break
        if task.done():
            task.result()  # surfaces why the session ended
        task.cancel()
        return payload["nodeId"], session.state.epoch

    node_id, epoch = asyncio.run(scenario())
    node = Node.objects.get(pk=node_id)
    assert node.provision_state == "adopted"
    assert node.session_epoch == epoch == 1
    assert node.devices.filter(present=True).count() == 8
    types = [e["type"] for e in fleet.api("nodes.events", nodeId=node_id)["items"]]
    for expected in ("node.joined", "node.connected", "node.acceptance.started",
                     "node.adopted"):
        assert expected in types
    order = [types.index(t) for t in ("node.joined", "node.connected",
                                      "node.acceptance.started", "node.adopted")]
    assert order == sorted(order)
