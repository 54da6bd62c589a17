"""A real gateway (gRPC over TLS, in a thread of its own) in front of a live API server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bcd.checks import diag_nvml
from bcd.contract.proto import agent_pb2 as pb
from bcd.inventory.fake import SimulatedInventory
from bcd.join.documents import Pins, check_wellknown, prepare, verify_answer
from bcd.session import AgentSession, Credentials
from fleet.pki import issue_gateway_certificate, pki
from tests.support.processes import free_port
from tests.support.work import ReportsApplier

POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}


@dataclass
class RunningGateway:
    target: str
    join_target: str
    loop: asyncio.AbstractEventLoop
    gateway: Any
    thread: threading.Thread
    serving: asyncio.Task[None]

    def stop(self) -> None:
        """As a real stop does: cancel the server, whose shutdown closes its sessions and
        its LISTEN connection. Merely stopping the loop would leave that connection open and
        unread, and its backend, once the notifications fill its socket, would hold back
        every DROP DATABASE on the server."""
        self.loop.call_soon_threadsafe(self.serving.cancel)
        self.thread.join(15)
        assert not self.thread.is_alive(), "the gateway did not stop"
        self.gateway.close()


def start_gateway(api_url: str, cert_dir: Path) -> RunningGateway:
    from gateway import server

    key, cert = issue_gateway_certificate(["localhost", "127.0.0.1"])
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "key.pem").write_text(key)
    (cert_dir / "cert.pem").write_text(cert)
    (cert_dir / "ca.pem").write_text(pki().ca_pem)
    port, join_port = free_port(), free_port()
    trust = pki().trust_domain
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def main() -> None:
            started = asyncio.Event()
            task = asyncio.create_task(server.serve(
                listen=f"127.0.0.1:{port}", join_listen=f"127.0.0.1:{join_port}",
                api_url=api_url, cert_dir=str(cert_dir),
                trust_domain=trust, ready=started, holder=holder))
            holder["serving"] = task
            await started.wait()
            ready.set()
            await task

        with contextlib.suppress(asyncio.CancelledError):  # stopped
            loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(15), "the gateway did not start"
    return RunningGateway(f"127.0.0.1:{port}", f"127.0.0.1:{join_port}", loop,
                          holder["gateway"], thread, holder["serving"])


@pytest.fixture
def gateway(live_server, tmp_path) -> Iterator[RunningGateway]:
    """The gateway, and a worker applying the reports it files."""
    applier = ReportsApplier()
    applier.start()
    running = start_gateway(live_server.url, tmp_path / "gw")
    yield running
    running.stop()
    applier.stop()


@dataclass
class Fleet:
    api: Any
    pool: dict[str, Any]
    wellknown: dict[str, Any]
    pins: Pins
    gateway: RunningGateway


@pytest.fixture
def fleet(root, gateway, live_server) -> Fleet:
    site = root("sites.create", kind="shared", region="eu-1")
    pool = root("pools.create", siteId=site["id"], gpuModel="H100", policy=POLICY,
                **{"class": "metal-host"})
    wellknown = httpx.get(f"{live_server.url}/.well-known/better-compute").json()
    shown = root("pki.show")
    pins = Pins(shown["servingCaSpkiPin"], shown["joinSigningKeyPin"],
                shown["joinEncryptionKeyPin"])
    return Fleet(root, pool, wellknown, pins, gateway)


async def join_through_gateway(fleet: Fleet, token: str, inventory: SimulatedInventory
                               ) -> tuple[Credentials, dict[str, Any]]:
    import grpc

    from bcd.contract.proto import agent_pb2_grpc

    check_wellknown(fleet.wellknown, fleet.pins)
    report = inventory.report()
    request = prepare(token, fleet.wellknown, report["hostname"])
    channel_creds = grpc.ssl_channel_credentials(fleet.wellknown["servingCaPem"].encode())
    async with grpc.aio.secure_channel(fleet.gateway.join_target, channel_creds) as channel:
        reply = await agent_pb2_grpc.AgentGatewayStub(channel).Join(pb.JoinRequest(
            sealed_token=request.sealed_token, csr_der=request.csr_der,
            hardware=pb.Hardware(hostname=report["hostname"], serial=report["serial"],
                                 product_uuid=report["productUuid"], macs=report["macs"])))
    if not reply.ok:
        raise PermissionError(reply.message)
    import json

    payload = verify_answer(json.loads(reply.signed_json), request, fleet.pins,
                            fleet.wellknown["trustDomain"])
    return Credentials(key=request.key, certificate_pem=payload["certificatePem"].encode(),
                       ca_pem=payload["caPem"].encode()), payload


async def diag(inventory: SimulatedInventory):
    async def run(command_id: str, kind: str,
                  payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if kind == "diag.nvml":  # the agent's own check
            return diag_nvml(inventory, payload)
        return "failed", {"error": f"unknown command {kind}"}

    return run


def session_for(fleet: Fleet, credentials: Credentials, inventory: SimulatedInventory,
                runner: Any) -> AgentSession:
    return AgentSession(credentials=credentials, target=fleet.gateway.target,
                        inventory=inventory, run_command=runner,
                        spec_pin=fleet.pins.join_signing)
