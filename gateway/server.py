"""The gateway: a standalone gRPC server holding node sessions over mTLS.

It relays joins and renewals to the API (it holds no CA, no signing key and no KEK), files
the reports it receives in each node's inbox for a worker to verify and apply (it cannot
apply them: its database role may not), and pushes the specs and commands the control plane
signed. It never calls IAM.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from django.conf import settings
from django.db import close_old_connections
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bcd.contract.proto import agent_pb2 as pb
from bcd.contract.proto import agent_pb2_grpc
from bcd.contract.reports import REPORT_KINDS
from bcd.contract.version import agent_refusal, version
from compute.core.db import listen_forever
from compute.core.metrics import HEARTBEAT_LAG, SESSIONS
from fleet import selectors
from fleet.services import sessions
from fleet.services.specs import DESIRED_CHANNEL
from gateway.sessions import BULK_WINDOW, Session

AGENT_SERVICE = pb.DESCRIPTOR.services_by_name["AgentGateway"].full_name
logger = logging.getLogger("gateway")


@dataclass(frozen=True)
class Identity:
    node_id: str
    site_id: str


def peer_identity(context: grpc.aio.ServicerContext, trust_domain: str) -> Identity | None:
    """The node named by the verified client certificate's SPIFFE ID, if any."""
    pems = context.auth_context().get("x509_pem_cert") or []
    if not pems:
        return None
    cert = x509.load_pem_x509_certificate(pems[0])
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    prefix = f"spiffe://{trust_domain}/site/"
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(prefix):
            site, _, rest = uri[len(prefix):].partition("/node/")
            if site and rest and "/" not in rest:
                return Identity(node_id=rest, site_id=site)
    return None


class Gateway(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(self, *, api_url: str, trust_domain: str, workers: int = 8,
                 name: str = "") -> None:
        self.api_url = api_url.rstrip("/")
        self.name = name  # what nodes get shows as the gateway holding a session
        self.trust_domain = trust_domain
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gw-db")
        self.sessions: dict[str, Session] = {}
        self.beats: dict[str, int] = {}
        self.heartbeats_received = 0
        self.spec_cursor: selectors.SpecCursor | None = None
        self.http = httpx.AsyncClient(timeout=30)

    def close(self) -> None:
        """Close every worker thread's database connection, then the pool."""
        import threading

        from django.db import connections

        workers = self.executor._max_workers
        barrier = threading.Barrier(workers)

        def close_here() -> None:
            connections.close_all()
            barrier.wait(5)

        for future in [self.executor.submit(close_here) for _ in range(workers)]:
            future.result(10)
        self.executor.shutdown(wait=True)

    async def db(self, func: Any, /, **kwargs: Any) -> Any:
        def call() -> Any:
            close_old_connections()
            return func(**kwargs)

        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    async def Join(self, request: pb.JoinRequest, context: Any) -> pb.JoinReply:
        body = {"sealedToken": request.sealed_token,
                "csr": base64.b64encode(request.csr_der).decode(),
                "hardware": {"hostname": request.hardware.hostname,
                             "serial": request.hardware.serial,
                             "productUuid": request.hardware.product_uuid,
                             "macs": list(request.hardware.macs)}}
        try:
            response = await self.http.post(f"{self.api_url}/api/agent/join", json=body)
            answer = response.json()
        except (httpx.HTTPError, ValueError):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the control plane is unreachable")
        if not answer.get("ok"):
            return pb.JoinReply(ok=False, message="join refused")
        return pb.JoinReply(ok=True, signed_json=json.dumps(answer["result"]))

    async def Session(self, request_iterator: Any, context: Any) -> Any:
        identity = peer_identity(context, self.trust_domain)
        if identity is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "a node certificate with a SPIFFE ID is required")
        node = await self.db(selectors.node_for_session, node_id=identity.node_id)
        if node is None or node.retired or node.site_id != identity.site_id:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this node may not connect")
        first = await anext(request_iterator.__aiter__(), None)
        if first is None or first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message is Hello")
        agent_version = first.hello.agent_version
        refusal = agent_refusal(agent_version, current=version())
        if refusal:
            await self.db(sessions.session_refuse, node_id=identity.node_id,
                          agent_version=agent_version, reason=refusal)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        epoch = await self.db(sessions.session_open, node_id=identity.node_id,
                              journal_epoch=first.hello.journal_epoch,
                              journal_generation=first.hello.journal_generation,
                              agent_version=agent_version, gateway=self.name)
        session = Session(node_id=identity.node_id, epoch=epoch)
        older = self.sessions.get(identity.node_id)
        if older is not None:
            older.close("a newer session of this node opened")
        self.sessions[identity.node_id] = session
        SESSIONS.set(len(self.sessions))
        yield pb.GatewayMessage(lane=pb.CONTROL, welcome=pb.Welcome(
            epoch=epoch, heartbeat_seconds=settings.BC_HEARTBEAT_SECONDS,
            lease_seconds=settings.BC_NODE_LEASE_SECONDS, node_id=identity.node_id))
        yield pb.GatewayMessage(lane=pb.CONTROL, credit=pb.Credit(lane=pb.BULK,
                                                                  credits=BULK_WINDOW))
        latest = await self.db(selectors.latest_spec, node_id=identity.node_id)
        if latest is not None and latest["generation"] > first.hello.applied_generation:
            session.send(pb.GatewayMessage(lane=pb.CONTROL, spec=pb.Spec(
                generation=latest["generation"], json=latest["json"])))
        tasks = [asyncio.create_task(self._read(session, request_iterator)),
                 asyncio.create_task(self._process(session))]
        try:
            while (message := await session.outgoing_message()) is not None:
                yield message
            yield pb.GatewayMessage(lane=pb.CONTROL, refused=pb.Refused(reason=session.closed))
        finally:
            for task in tasks:
                task.cancel()
            if self.sessions.get(identity.node_id) is session:
                del self.sessions[identity.node_id]
            SESSIONS.set(len(self.sessions))

    async def _read(self, session: Session, request_iterator: Any) -> None:
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("body")
                if kind == "credit":
                    session.grant(message.credit.lane, message.credit.credits)
                    continue
                error = session.accept(message)
                if error:
                    session.close(error)
                    return
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        session.close("the agent closed the session")

    async def _process(self, session: Session) -> None:
        while (message := await session.incoming_message()) is not None:
            try:
                await self._handle(session, message)
            except sessions.StaleSession:
                session.close("a newer session of this node exists")
            except (PermissionError, ValueError) as error:
                logger.warning("node %s: %s", session.node_id, error)
                session.close(str(error))
            except Exception:  # e.g. Postgres restarted: the agent reconnects and resends
                logger.exception("node %s: report not recorded; closing the session",
                                 session.node_id)
                session.close("the control plane could not record a report; reconnect")

    @staticmethod
    def _bulk_done(session: Session, report_id: str, *, duplicate: bool) -> None:
        """Acknowledge a bulk report and give its slot back to the agent."""
        session.bulk_outstanding -= 1
        session.send(pb.GatewayMessage(lane=pb.BULK, ack=pb.Ack(report_id=report_id,
                                                                duplicate=duplicate)))
        session.send(pb.GatewayMessage(lane=pb.CONTROL, credit=pb.Credit(lane=pb.BULK,
                                                                         credits=1)))

    async def _handle(self, session: Session, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("body")
        node = session.node_id
        if kind == "heartbeat":
            self.beats[node] = session.epoch
            self.heartbeats_received += 1
            if sent := message.heartbeat.sent_at_ms:  # a node's clock ahead of ours reads 0
                HEARTBEAT_LAG.observe(max(0.0, time.time() - sent / 1000))
            return
        if kind in REPORT_KINDS:  # filed as the node signed it, for a worker to verify
            report = getattr(message, kind)
            fields = {"reportId": message.report_id, "body": report.json,
                      "reportSignature": message.signature}
            if kind not in ("inventory", "telemetry"):
                fields["signature"] = report.signature
            if kind == "command_result":
                fields.update(commandId=report.command_id, status=report.status)
            await self.db(sessions.reports_file, node_id=node, epoch=session.epoch,
                          reports=[(kind, fields)])
            if kind in ("inventory", "telemetry"):
                self._bulk_done(session, message.report_id, duplicate=False)
            else:
                session.send(pb.GatewayMessage(lane=pb.CONTROL, ack=pb.Ack(
                    report_id=message.report_id, duplicate=False)))
        elif kind == "renew":
            response = await self.http.post(f"{self.api_url}/api/agent/renew", json={
                "nodeId": node, "csr": base64.b64encode(message.renew.csr_der).decode()})
            answer = response.json()
            if answer.get("ok"):
                session.send(pb.GatewayMessage(lane=pb.CONTROL, renewed=pb.Renewed(
                    certificate_pem=answer["result"]["certificatePem"])))

    async def housekeeping(self, *, interval: float = 0.5, least: float = 0.02) -> None:
        """Flush heartbeats, push queued commands and new desired specs: every `interval`,
        and at once (at most every `least` seconds) when a commit changed what some node
        should hold or run."""
        woken = asyncio.Event()
        listener = asyncio.create_task(listen_forever(DESIRED_CHANNEL,
                                                      lambda _payload: woken.set()))
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), interval)
                woken.clear()
                await self._pass()
                await asyncio.sleep(least)
        finally:
            listener.cancel()

    async def _pass(self) -> None:
        """One pass of housekeeping."""
        try:
            beats, self.beats = self.beats, {}
            stale, back = await self.db(sessions.heartbeats_record, beats=beats)
            for node_id in stale:  # only the session the beat came on, not a newer one
                session = self.sessions.get(node_id)
                if session is not None and session.epoch == beats[node_id]:
                    session.close("a newer session of this node exists")
            for node_id in back:
                with contextlib.suppress(sessions.StaleSession):  # replaced meanwhile
                    await self.db(sessions.node_reconnect, node_id=node_id,
                                  epoch=beats[node_id])
            live = {n: s.epoch for n, s in self.sessions.items() if not s.closed}
            if live:
                for command in await self.db(sessions.commands_to_send,
                                             node_epochs=live):
                    session = self.sessions.get(command["nodeId"])
                    if session is not None:  # a BMC action goes on its own lane
                        lane = (pb.PROVISION if command["kind"].startswith("bmc.")
                                else pb.CONTROL)
                        session.send(pb.GatewayMessage(lane=lane, command=pb.Command(
                            command_id=command["commandId"], kind=command["kind"],
                            json=command["json"])))
            specs, self.spec_cursor = await self.db(selectors.specs_since,
                                                    after=self.spec_cursor)
            for spec in specs:
                session = self.sessions.get(spec["nodeId"])
                if session is not None:
                    session.send(pb.GatewayMessage(lane=pb.CONTROL, spec=pb.Spec(
                        generation=spec["generation"], json=spec["json"])))
        except Exception:
            logger.exception("gateway housekeeping failed; retrying")


SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class CertificateFiles:
    """The gateway's key, certificate and CA in `cert_dir`, read again on the next handshake
    once a renewal replaced them (their modification times changed)."""

    NAMES = ("key.pem", "cert.pem", "ca.pem")

    def __init__(self, cert_dir: Path) -> None:
        self.cert_dir = cert_dir
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[int, ...]:
        return tuple((self.cert_dir / name).stat().st_mtime_ns for name in self.NAMES)

    def configuration(self) -> Any:
        """The files as a gRPC configuration; ValueError while the key and the certificate
        do not belong together (a renewal half written)."""
        key, cert, ca = ((self.cert_dir / name).read_bytes() for name in self.NAMES)
        certified = x509.load_pem_x509_certificate(cert).public_key()
        private = serialization.load_pem_private_key(key, None)
        if certified.public_bytes(*SPKI) != private.public_key().public_bytes(*SPKI):
            raise ValueError("key.pem and cert.pem do not match")
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> Any:
        """gRPC's fetcher: a new configuration when the files changed, else None (keep)."""
        try:
            stamp = self._stamp()
            if stamp == self.stamp:
                return None
            configuration = self.configuration()
        except (OSError, ValueError):  # half written: keep the old pair, look again next time
            return None
        self.stamp = stamp
        logger.info("gateway: certificate in %s renewed; new handshakes use it", self.cert_dir)
        return configuration

    def credentials(self, *, require_client_auth: bool) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.configuration(), self.fetch,
            require_client_authentication=require_client_auth)


async def serve(*, listen: str, join_listen: str, api_url: str, cert_dir: str,
                trust_domain: str, ready: asyncio.Event | None = None,
                holder: dict[str, Any] | None = None, name: str = "") -> None:
    """Serve sessions on `listen` (mTLS: a node certificate is required) and joins on
    `join_listen` (TLS only: a joining machine has no certificate yet)."""
    session_credentials = CertificateFiles(Path(cert_dir)).credentials(require_client_auth=True)
    join_credentials = CertificateFiles(Path(cert_dir)).credentials(require_client_auth=False)
    gateway = Gateway(api_url=api_url, trust_domain=trust_domain,
                      name=name or f"{socket.gethostname()}:{listen.rpartition(':')[2]}")
    if holder is not None:
        holder["gateway"] = gateway
    server = grpc.aio.server(options=[("grpc.keepalive_time_ms", 20_000)])
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(gateway, server)
    health_servicer = health.aio.HealthServicer()  # grpc.health.v1, on both ports
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_secure_port(listen, session_credentials)
    server.add_secure_port(join_listen, join_credentials)
    await server.start()
    for service in ("", AGENT_SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    keeper = asyncio.create_task(gateway.housekeeping())
    logger.info("gateway %s: sessions on %s, joins on %s (API %s)", gateway.name, listen,
                join_listen, api_url)
    if ready is not None:
        ready.set()
    try:
        await server.wait_for_termination()
    finally:
        keeper.cancel()
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace=5)
        await asyncio.to_thread(gateway.close)
