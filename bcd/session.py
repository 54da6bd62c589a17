"""The agent's session with the gateway: mTLS, Hello/Welcome, heartbeats, reports within
credits, commands run and reported signed with the node key."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bcd.contract.crypto import BadSignature, sign_bytes
from bcd.contract.holds import BadHold
from bcd.contract.proto import agent_pb2 as pb
from bcd.contract.proto import agent_pb2_grpc
from bcd.contract.reports import REPORT_KINDS, statement
from bcd.contract.signed import open_command, open_spec
from bcd.contract.version import PROTOCOL, version

logger = logging.getLogger("bcd.session")

CommandRunner = Callable[[str, str, dict[str, Any]], Awaitable[tuple[str, dict[str, Any]]]]
# (generation, spec) -> signed reports to send: [("bound" | "released" | …, json, signature)]
SpecApplier = Callable[[int, dict[str, Any]], Awaitable[list[tuple[str, str, str]]]]


@dataclass
class Credentials:
    key: ec.EllipticCurvePrivateKey
    certificate_pem: bytes
    ca_pem: bytes

    def channel(self, target: str, server_name: str | None = None) -> grpc.aio.Channel:
        key_pem = self.key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption())
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca_pem,
                                             private_key=key_pem,
                                             certificate_chain=self.certificate_pem)
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        return grpc.aio.secure_channel(target, creds, options=options)


@dataclass
class SessionState:
    node_id: str = ""
    epoch: int = 0
    heartbeat_seconds: int = 10
    connected: bool = False
    bulk_credits: int = 0
    acked: dict[str, float] = field(default_factory=dict)
    acks: list[tuple[str, bool]] = field(default_factory=list)  # (report id, duplicate)
    refused: str = ""
    on_renewed: Callable[[str, bytes], object] | None = None


class AgentSession:
    """One session. `run()` returns when the gateway ends it or refuses it."""

    def __init__(self, *, credentials: Credentials, target: str, inventory: Any,
                 run_command: CommandRunner, journal_epoch: int = 0,
                 apply_spec: SpecApplier | None = None, applied_generation: int = 0,
                 journal_generation: int = 0, spec_pin: str = "",
                 agent_version: str = "") -> None:
        self.credentials = credentials
        self.agent_version = agent_version or version()  # what Hello says
        self.target = target
        self.inventory = inventory
        self.run_command = run_command
        self.journal_epoch = journal_epoch
        self.apply_spec = apply_spec
        self.spec_pin = spec_pin  # the join-signing key's pin: specs and commands carry its
        # signature
        self.applied_generation = applied_generation
        self.journal_generation = journal_generation  # what the journal applied, ever
        self.state = SessionState()
        self.control: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        self.bulk: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        self.credit_event = asyncio.Event()

    def _message(self, **body: Any) -> pb.AgentMessage:
        return pb.AgentMessage(epoch=self.state.epoch, report_id=secrets.token_hex(12), **body)

    def send_inventory(self, report: dict[str, Any] | None = None) -> str:
        """Queue the inventory (read now unless given) on the bulk lane."""
        report = self.inventory.report() if report is None else report
        message = self._message(inventory=pb.Report(json=json.dumps(report)))
        self.bulk.put_nowait(message)
        self.credit_event.set()  # wake the writer, which may be idle waiting on control
        return str(message.report_id)

    def send_telemetry(self, readings: dict[str, dict[str, float]]) -> bool:
        """Queue GPU readings on the bulk lane, unless bulk reports are still waiting for
        credits (then these are dropped: only fresh readings are worth sending)."""
        if not self.state.connected or not self.bulk.empty():
            return False
        self.bulk.put_nowait(self._message(telemetry=pb.Report(json=json.dumps(
            {"gpus": readings}))))
        self.credit_event.set()
        return True

    def request_renewal(self, key: ec.EllipticCurvePrivateKey) -> None:
        """Send a CSR for the same key; the gateway relays it and answers Renewed."""
        from bcd.join.documents import csr_for

        self.send_control(self._message(renew=pb.Renew(csr_der=csr_for(key, self.state.node_id))))

    def send_reports(self, reports: list[tuple[str, str, str]]) -> None:
        """Queue signed reports (kind, json, signature) on the control lane."""
        for report, body, signature in reports:
            field_type = {"bound": pb.AllocationBound, "released": pb.AllocationReleased,
                          "failed": pb.AllocationFailed, "vm": pb.VmReport}[report]
            self.send_control(self._message(**{report: field_type(json=body,
                                                                  signature=signature)}))

    def send_control(self, message: pb.AgentMessage) -> None:
        self.control.put_nowait(message)

    async def _outgoing(self) -> AsyncIterator[pb.AgentMessage]:
        yield pb.AgentMessage(hello=pb.Hello(agent_version=self.agent_version,
                                             protocol=PROTOCOL,
                                             journal_epoch=self.journal_epoch,
                                             applied_generation=self.applied_generation,
                                             journal_generation=self.journal_generation))
        while True:
            if not self.control.empty():
                yield self._signed(self.control.get_nowait())
                continue
            if self.state.bulk_credits > 0 and not self.bulk.empty():
                self.state.bulk_credits -= 1
                message = self.bulk.get_nowait()
                message.epoch = self.state.epoch
                yield self._signed(message)
                continue
            self.credit_event.clear()
            waiters = [asyncio.ensure_future(self.control.get()),
                       asyncio.ensure_future(self.credit_event.wait())]
            done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            first = waiters[0]
            if first in done:
                yield self._signed(first.result())

    def _signed(self, message: pb.AgentMessage) -> pb.AgentMessage:
        """A report signed by the node key over its statement, as it leaves (its epoch is
        final then); other messages as they are."""
        kind = message.WhichOneof("body")
        if kind in REPORT_KINDS:
            report = getattr(message, kind)
            command = ({"command_id": report.command_id, "status": report.status}
                       if kind == "command_result" else {})
            message.signature = sign_bytes(self.credentials.key, statement(
                kind=kind, report_id=message.report_id, epoch=message.epoch, body=report.json,
                **command))
        return message

    async def on_spec(self, message: pb.Spec) -> bool:
        """Apply a spec the control plane signed for this node and generation; anything
        else (a gateway's forgery, another node's spec, a replay) is refused whole."""
        if self.apply_spec is None:
            return False
        try:
            spec = open_spec(message.json, pin=self.spec_pin, node_id=self.state.node_id,
                             generation=message.generation)
            reports = await self.apply_spec(message.generation, spec)
        except (BadHold, BadSignature, ValueError) as refusal:
            logger.error("spec generation %d refused, nothing applied: %s",
                         message.generation, refusal)
            return False
        self.send_reports(reports)
        self.applied_generation = max(self.applied_generation, message.generation)
        return True

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.state.heartbeat_seconds)
            self.send_control(self._message(heartbeat=pb.Heartbeat(
                sent_at_ms=int(time.time() * 1000))))

    async def _command(self, command: pb.Command) -> None:
        """Run a command the control plane signed for this node; a forged one is answered
        `failed` with a `refused: …` error (signed by the node) and nothing runs."""
        try:
            params = open_command(command.json, pin=self.spec_pin, node_id=self.state.node_id,
                                  command_id=command.command_id, kind=command.kind)
        except BadSignature as refusal:
            logger.error("command %s refused, not run: %s", command.command_id, refusal)
            status, output = "failed", {"error": f"refused: {refusal}"}
        else:
            status, output = await self.run_command(command.command_id, command.kind, params)
        body = json.dumps(output, sort_keys=True)
        signature = sign_bytes(self.credentials.key,
                               f"{command.command_id}\n{status}\n{body}".encode())
        self.send_control(self._message(command_result=pb.CommandResult(
            command_id=command.command_id, status=status, json=body, signature=signature)))

    async def run(self, *, on_welcome: Callable[[SessionState], None] | None = None) -> str:
        async with self.credentials.channel(self.target) as channel:
            stub = agent_pb2_grpc.AgentGatewayStub(channel)
            call = stub.Session(self._outgoing())
            heartbeats: asyncio.Task[None] | None = None
            tasks: set[asyncio.Task[None]] = set()
            try:
                async for message in call:
                    kind = message.WhichOneof("body")
                    if kind not in ("welcome", "refused"):
                        # Every message taken off a lane frees one slot on that lane.
                        self.send_control(pb.AgentMessage(
                            epoch=self.state.epoch,
                            credit=pb.Credit(lane=message.lane, credits=1)))
                    if kind == "welcome":
                        self.state.node_id = message.welcome.node_id
                        self.state.epoch = message.welcome.epoch
                        self.state.heartbeat_seconds = message.welcome.heartbeat_seconds
                        self.state.connected = True
                        heartbeats = asyncio.create_task(self._heartbeats())
                        self.send_control(self._message(heartbeat=pb.Heartbeat(
                            sent_at_ms=int(time.time() * 1000))))
                        for lane, credits in ((pb.CONTROL, 64), (pb.BULK, 64)):
                            self.send_control(pb.AgentMessage(
                                epoch=self.state.epoch,
                                credit=pb.Credit(lane=lane, credits=credits)))
                        if on_welcome:
                            on_welcome(self.state)
                    elif kind == "credit" and message.credit.lane == pb.BULK:
                        self.state.bulk_credits += message.credit.credits
                        self.credit_event.set()
                    elif kind == "ack":
                        self.state.acked[message.ack.report_id] = time.monotonic()
                        self.state.acks.append((message.ack.report_id, message.ack.duplicate))
                    elif kind == "command":
                        task = asyncio.create_task(self._command(message.command))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    elif kind == "spec":
                        await self.on_spec(message.spec)
                    elif kind == "renewed":
                        pem = message.renewed.certificate_pem.encode()
                        self.credentials.certificate_pem = pem
                        if self.state.on_renewed is not None:
                            self.state.on_renewed("pem", pem)
                    elif kind == "refused":
                        self.state.refused = message.refused.reason
                        break
            finally:
                self.state.connected = False
                if heartbeats is not None:
                    heartbeats.cancel()
                call.cancel()
        return self.state.refused
