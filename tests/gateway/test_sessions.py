"""Join and session through a real gateway over TLS and mTLS, against a live API."""

from __future__ import annotations

import asyncio
import time

import pytest

from bcd.inventory.fake import SimulatedInventory
from fleet.models import Node, NodeReport, ReportInbox
from fleet.services.sessions import session_changes_pending
from tests.gateway.conftest import diag, join_through_gateway, session_for
from tests.support.waiting import eventually, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_node_joins_through_the_gateway_and_is_adopted(fleet):
    token = fleet.api("joinTokens.create", poolId=fleet.pool["id"], ttl=3_600_000)["token"]
    inventory = SimulatedInventory("gpu-01")

    async def scenario():
        credentials, payload = await join_through_gateway(fleet, token, inventory)
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run(on_welcome=lambda s: session.send_inventory()))
        for _ in range(200):
            await asyncio.sleep(0.1)
            if await eventually(lambda: Node.objects.get(
                    pk=payload["nodeId"]).provision_state == "adopted", timeout=0.1):
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


def joined(fleet, name="gpu-01", inventory=None, token=None):
    token = token or fleet.api("joinTokens.create", poolId=fleet.pool["id"],
                               ttl=3_600_000)["token"]
    inventory = inventory or SimulatedInventory(name)
    credentials, payload = asyncio.run(join_through_gateway(fleet, token, inventory))
    return credentials, payload, inventory


def certificate(key, issuer_key, issuer_name, node_id, site_id, trust, *, hours=24,
                expired=False):
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)
    start, end = ((now - timedelta(hours=48), now - timedelta(hours=24)) if expired
                  else (now - timedelta(minutes=5), now + timedelta(hours=hours)))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
            .issuer_name(issuer_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(
                f"spiffe://{trust}/site/{site_id}/node/{node_id}")]), critical=False)
            .sign(issuer_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def session_refusal(fleet, credentials, inventory):
    """How a session with these credentials ends: the refusal text or the gRPC status."""
    import grpc

    async def attempt():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        try:
            return await asyncio.wait_for(session.run(), 30)
        except grpc.aio.AioRpcError as error:
            return error.code().name

    return asyncio.run(attempt())


def test_a_certificate_from_another_ca_is_refused(fleet):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509 import Name, NameAttribute
    from cryptography.x509.oid import NameOID

    from bcd.session import Credentials

    credentials, payload, inventory = joined(fleet)
    rogue_ca = ec.generate_private_key(ec.SECP256R1())
    forged = certificate(credentials.key, rogue_ca,
                         Name([NameAttribute(NameOID.COMMON_NAME, "rogue")]),
                         payload["nodeId"], payload["siteId"], fleet.wellknown["trustDomain"])
    result = session_refusal(fleet, Credentials(credentials.key, forged, credentials.ca_pem),
                             inventory)
    assert result == "UNAVAILABLE"  # the TLS handshake fails
    assert Node.objects.get(pk=payload["nodeId"]).session_epoch == 0


def test_an_expired_certificate_is_refused(fleet):
    from bcd.session import Credentials
    from fleet.pki import pki

    credentials, payload, inventory = joined(fleet)
    authority = pki()
    stale = certificate(credentials.key, authority.ca_key, authority.ca_cert.subject,
                        payload["nodeId"], payload["siteId"], authority.trust_domain,
                        expired=True)
    result = session_refusal(fleet, Credentials(credentials.key, stale, credentials.ca_pem),
                             inventory)
    assert result == "UNAVAILABLE"
    assert Node.objects.get(pk=payload["nodeId"]).session_epoch == 0


def test_a_retired_nodes_certificate_is_refused(fleet):
    credentials, payload, inventory = joined(fleet)
    Node.objects.filter(pk=payload["nodeId"]).update(provision_state="retired")
    assert session_refusal(fleet, credentials, inventory) == "PERMISSION_DENIED"


def test_an_older_session_epoch_cannot_act(fleet):
    credentials, _payload, inventory = joined(fleet)

    async def scenario():
        first = session_for(fleet, credentials, inventory, await diag(inventory))
        first_task = asyncio.create_task(first.run())
        while not first.state.connected:
            await asyncio.sleep(0.05)
        second = session_for(fleet, credentials, inventory, await diag(inventory))
        second_task = asyncio.create_task(second.run())
        refused = await asyncio.wait_for(first_task, 30)
        assert second.state.connected or await eventually(lambda: second.state.connected)
        # A message stamped with the old epoch, on the new session, ends it too.
        from bcd.contract.proto import agent_pb2 as pb

        second.send_control(pb.AgentMessage(epoch=first.state.epoch, report_id="old",
                                            heartbeat=pb.Heartbeat(sent_at_ms=1)))
        stale = await asyncio.wait_for(second_task, 30)
        return first.state.epoch, second.state.epoch, refused, stale

    first_epoch, second_epoch, refused, stale = asyncio.run(scenario())
    assert (first_epoch, second_epoch) == (1, 2)
    assert "newer session" in refused
    assert "epoch 1" in stale


def test_a_resent_report_is_acknowledged_but_not_processed_twice(fleet):
    from bcd.contract.proto import agent_pb2 as pb

    credentials, payload, inventory = joined(fleet)

    async def scenario():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run())
        await eventually(lambda: session.state.connected)
        first = pb.AgentMessage(epoch=session.state.epoch, report_id="inv-1",
                                inventory=pb.Report(json='{"hostname":"gpu-01","vcpus":96,'
                                                    '"memoryGiB":1024,"gpus":[]}'))
        session.bulk.put_nowait(first)
        session.bulk.put_nowait(pb.AgentMessage().__class__.FromString(
            first.SerializeToString()))
        session.credit_event.set()
        acks = lambda: [dup for rid, dup in session.state.acks if rid == "inv-1"]  # noqa: E731
        answered = await eventually(lambda: len(acks()) == 2, timeout=30)
        task.cancel()
        return answered, acks()

    answered, acks = asyncio.run(scenario())
    assert answered, "the resent report was never acknowledged"
    assert acks == [False, False]  # both filed; the worker applies the first only
    node_id = payload["nodeId"]
    assert wait_until(lambda: not ReportInbox.objects.filter(node_id=node_id).exists())
    assert Node.objects.get(pk=node_id).inventory_generation == 1
    assert NodeReport.objects.filter(node_id=node_id, report_id="inv-1").count() == 1


def test_join_heartbeats_inventory_and_commands_never_call_iam(fleet, settings):
    from compute.platform.iam import _backend
    from tests.support.iam import CountingIAM

    token = fleet.api("joinTokens.create", poolId=fleet.pool["id"], ttl=3_600_000)["token"]
    settings.BC_IAM_BACKEND = "tests.support.iam.CountingIAM"
    _backend.cache_clear()
    CountingIAM.decisions.clear()
    try:
        credentials, payload, inventory = joined(fleet, token=token)

        async def scenario():
            session = session_for(fleet, credentials, inventory, await diag(inventory))
            session.state.heartbeat_seconds = 1
            task = asyncio.create_task(session.run(on_welcome=lambda s: session.send_inventory()))
            adopted = await eventually(lambda: Node.objects.filter(
                pk=payload["nodeId"], provision_state="adopted").exists(), timeout=20)
            task.cancel()
            return adopted

        assert asyncio.run(scenario())
        assert fleet.gateway.gateway.heartbeats_received >= 1
        assert CountingIAM.decisions == []
    finally:
        _backend.cache_clear()


def test_a_bulk_flood_does_not_delay_control_beyond_one_heartbeat(fleet):
    from bcd.contract.proto import agent_pb2 as pb

    credentials, _payload, inventory = joined(fleet)
    report = '{"hostname":"gpu-01","vcpus":96,"memoryGiB":1024,"gpus":[]}'

    async def scenario():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run())
        await eventually(lambda: session.state.connected)
        for n in range(400):
            session.bulk.put_nowait(pb.AgentMessage(epoch=session.state.epoch,
                                                    report_id=f"flood-{n}",
                                                    inventory=pb.Report(json=report)))
        session.credit_event.set()
        await eventually(lambda: any(k.startswith("flood-") for k in session.state.acked))
        sent = time.monotonic()
        command_id = "cmd_01jbx0000000000000000000aa"
        body = "{}"
        from bcd.contract.crypto import sign_bytes

        session.send_control(pb.AgentMessage(
            epoch=session.state.epoch, report_id="control-1",
            command_result=pb.CommandResult(command_id=command_id, status="succeeded",
                                            json=body, signature=sign_bytes(
                                                credentials.key,
                                                f"{command_id}\nsucceeded\n{body}".encode()))))
        await eventually(lambda: "control-1" in session.state.acked, timeout=30)
        control_latency = session.state.acked["control-1"] - sent
        flood_done = await eventually(lambda: "flood-399" in session.state.acked, timeout=120)
        task.cancel()
        control_at = session.state.acked["control-1"]
        return control_latency, flood_done, sum(
            1 for k, at in session.state.acked.items() if k.startswith("flood-") and
            at < control_at)

    latency, flood_done, flood_acked_before = asyncio.run(scenario())
    assert flood_done
    assert latency < 10, latency  # one heartbeat interval
    # Priority and credits: the control report overtakes the queued flood, so it is
    # answered while most of the 400 bulk reports still wait.
    assert flood_acked_before < 100, flood_acked_before


def test_the_certificate_is_renewed_over_the_session_for_the_same_key(fleet):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    from bcd.contract.proto import agent_pb2 as pb

    credentials, _payload, inventory = joined(fleet)
    original = x509.load_pem_x509_certificate(credentials.certificate_pem)
    renewed: dict[str, bytes] = {}

    async def scenario():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run())
        await eventually(lambda: session.state.connected)
        csr = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "renew")]))
               .sign(credentials.key, hashes.SHA256()))
        session.state.on_renewed = renewed.setdefault
        session.send_control(session._message(renew=pb.Renew(
            csr_der=csr.public_bytes(serialization.Encoding.DER))))
        await eventually(lambda: "pem" in renewed, timeout=30)
        task.cancel()

    asyncio.run(scenario())
    cert = x509.load_pem_x509_certificate(renewed["pem"])
    assert credentials.certificate_pem == renewed["pem"]  # the agent uses it from now on
    assert cert.serial_number != original.serial_number
    assert cert.public_key() == original.public_key()
    assert cert.not_valid_after_utc >= original.not_valid_after_utc


def test_a_quiet_node_becomes_unreachable_and_keeps_what_it_holds(fleet):
    from tests.factories import lapse_lease
    from tests.reservations.conftest import reserve

    credentials, payload, inventory = joined(fleet)

    async def connect_and_adopt():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run(on_welcome=lambda s: session.send_inventory()))
        await eventually(lambda: Node.objects.filter(pk=payload["nodeId"],
                                                      provision_state="adopted").exists(), 20)
        task.cancel()

    asyncio.run(connect_and_adopt())
    rsv = reserve(fleet.api, fleet.pool, 4).result
    assert rsv["state"] == "binding"
    assert lapse_lease(payload["nodeId"]) is not None
    node = Node.objects.get(pk=payload["nodeId"])
    assert (node.connectivity, node.schedulable) == ("unreachable", False)
    assert fleet.api("reservations.get", reservationId=rsv["id"])["state"] == "binding"
    assert reserve(fleet.api, fleet.pool, 1).result["state"] == "pending"


def test_a_session_without_a_client_certificate_is_refused(fleet):
    import grpc

    from bcd.contract.proto import agent_pb2 as pb
    from bcd.contract.proto import agent_pb2_grpc

    async def attempt():
        creds = grpc.ssl_channel_credentials(fleet.wellknown["servingCaPem"].encode())
        async with grpc.aio.secure_channel(fleet.gateway.target, creds) as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Session(
                iter([pb.AgentMessage(hello=pb.Hello())]))
            try:
                async for _ in call:
                    return "answered"
            except grpc.aio.AioRpcError as error:
                return error.code().name
        return "closed"

    assert asyncio.run(attempt()) == "UNAVAILABLE"


def test_failed_acceptance_is_sticky_until_nodes_adopt(fleet, tmp_path):
    from bcd.inventory.faults import faults_file, inject
    from fleet.models import NodeSpec

    inject(faults_file(tmp_path), 3, "nvlink-down")
    broken = SimulatedInventory("gpu-07", root=str(tmp_path))
    credentials, payload, _ = joined(fleet, inventory=broken)
    node_id = payload["nodeId"]

    async def run_with(inventory, until):
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run(on_welcome=lambda s: session.send_inventory()))
        ok = await eventually(lambda: Node.objects.get(pk=node_id).provision_state == until, 30)
        task.cancel()
        return ok

    assert asyncio.run(run_with(broken, "acceptance-failed"))
    node = Node.objects.get(pk=node_id)
    assert node.acceptance["failure"] == "diag.nvml: GPU 3 1 NVLink link(s) down"
    conditions = fleet.api("nodes.get", nodeId=node_id)["conditions"]
    assert {"type": "Accepted", "status": False,
            "reason": node.acceptance["failure"]} in conditions
    assert fleet.api.call("nodes.adopt", nodeId=node_id, reason="x").ok  # starts attempt 2
    assert Node.objects.get(pk=node_id).acceptance["attempt"] == 2
    fixed = SimulatedInventory("gpu-07")
    assert asyncio.run(run_with(fixed, "adopted"))
    assert list(NodeSpec.objects.filter(node_id=node_id).values_list("generation", flat=True)) \
        == [1]
    types = [e["type"] for e in fleet.api("nodes.events", nodeId=node_id)["items"]]
    assert "node.acceptance.failed" in types
    assert types[-1] == "node.adopted"
    again = fleet.api.call("nodes.adopt", nodeId=node_id, reason="x")
    assert again.code == "invalid_state"


def test_a_node_that_comes_back_is_reconnected(fleet):
    from tests.factories import lapse_lease

    credentials, payload, inventory = joined(fleet)

    async def connect_once():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run())
        ok = await eventually(lambda: session.state.connected)
        task.cancel()
        return ok

    assert asyncio.run(connect_once())
    assert lapse_lease(payload["nodeId"]) is not None
    assert asyncio.run(connect_once())
    # What the gateway filed of the new session is recorded by a worker (here the fixture's
    # reports applier), after the agent was welcomed.
    assert wait_until(lambda: not session_changes_pending(payload["nodeId"]), 10)
    types = [e["type"] for e in fleet.api("nodes.events", nodeId=payload["nodeId"])["items"]]
    assert types[-3:] == ["node.connected", "node.unreachable", "node.reconnected"]
    assert Node.objects.get(pk=payload["nodeId"]).connectivity == "connected"


def test_a_heartbeat_of_an_older_session_written_late_leaves_the_newer_session_open(fleet):
    """The gateway flushes heartbeats in batches: one received on a session that has since
    been replaced is written after the new one opened. It is stale; the new session stays."""
    credentials, payload, inventory = joined(fleet)
    node_id = payload["nodeId"]
    gateway = fleet.gateway.gateway

    async def connect_then_flush_an_old_beat():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run())
        assert await eventually(lambda: session.state.connected)
        current = gateway.sessions[node_id]
        gateway.beats[node_id] = current.epoch - 1  # the older session's, not yet written
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(gateway._pass(),
                                                                   fleet.gateway.loop))
        closed, still = current.closed, gateway.sessions.get(node_id) is current
        task.cancel()
        return closed, still

    assert asyncio.run(connect_then_flush_an_old_beat()) == ("", True)
