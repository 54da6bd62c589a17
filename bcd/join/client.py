"""`bcd join`: from the control plane's well-known document to a node certificate."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from cryptography.hazmat.primitives import serialization

from bcd.config import Config, Paths, write_private
from bcd.contract.proto import agent_pb2 as pb
from bcd.contract.proto import agent_pb2_grpc
from bcd.inventory import inventory_for
from bcd.join.documents import (
    JoinError,
    JoinRefused,
    Pins,
    check_wellknown,
    prepare,
    verify_answer,
)


def wellknown_url(server: str) -> str:
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise JoinError(f"--server must be an http(s) URL, got {server!r}")
    if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise JoinError("--server uses plain http for a non-loopback host: use https")
    return f"{parts.scheme}://{parts.netloc}/.well-known/better-compute"


def fetch_wellknown(server: str) -> dict[str, Any]:
    url = wellknown_url(server)
    try:
        with urllib.request.urlopen(url, timeout=15) as response:  # noqa: S310 (http(s) only)
            document = json.loads(response.read())
    except (OSError, ValueError) as error:
        raise JoinError(f"cannot read {url}: {error}") from None
    if not isinstance(document, dict):
        raise JoinError(f"{url} is not a JSON object")
    return document


def grpc_target(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


async def _join_rpc(target: str, ca_pem: bytes, request: pb.JoinRequest) -> pb.JoinReply:
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    async with grpc.aio.secure_channel(target, creds) as channel:
        return await agent_pb2_grpc.AgentGatewayStub(channel).Join(request, timeout=60)


def published_gateways(document: dict[str, Any]) -> str:
    """The session gateways a well-known document publishes, as the config's `gateway`
    holds them: gRPC targets, comma separated ("" for none)."""
    urls = document.get("gatewayUrls") or [document.get("gatewayUrl")]
    if not isinstance(urls, list):
        return ""
    return ",".join(grpc_target(url) for url in urls if isinstance(url, str) and url)


def session_gateway(document: dict[str, Any], pinned: str | None) -> str:
    """The gateways for sessions: those the control plane publishes (a pinned one that
    is not among them is reported), else the pinned one (`--gateway-url`)."""
    published = published_gateways(document)
    if published and pinned and grpc_target(pinned) not in published.split(","):
        print(f"bcd join: warning: the control plane publishes the gateways {published}, not "
              f"{pinned}; using {published}", file=sys.stderr)
    chosen = published or (grpc_target(pinned) if pinned else "")
    if not chosen:
        raise JoinError("the control plane publishes no gateway (gatewayUrl) and none was "
                        "given (--gateway-url)")
    return chosen


def published_gateway(config: Config) -> str | None:
    """The session gateways the control plane publishes now (comma separated), its
    document's pins checked against the node's; None when it cannot be read or names none."""
    try:
        document = fetch_wellknown(config.server)
        check_wellknown(document, Pins(config.serving_ca_pin, config.join_signing_pin,
                                       config.join_encryption_pin))
    except (JoinError, KeyError, ValueError) as error:
        print(f"bcd: cannot read where the gateway is: {error}", file=sys.stderr)
        return None
    return published_gateways(document) or None


def simulated_name(root: Path) -> str:
    """A simulated machine's name when none is given: its root's folder name and a digest of
    the root's full path. Its serial, product UUID and GPU UUIDs derive from the name, so two
    machines joined from two roots on one host are two machines, not clones of the host."""
    where = root.resolve()
    label = re.sub(r"[^a-z0-9-]+", "-", where.name.lower()).strip("-") or "machine"
    return f"sim-{label[:40]}-{hashlib.sha256(str(where).encode()).hexdigest()[:6]}"


def join(*, server: str, pins: Pins, token: str, root: Path, sim: bool, sim_gpus: int,
         sim_variant: str, hostname: str | None, gateway_url: str | None = None,
         expect_site: str | None = None) -> tuple[Config, str]:
    """Join and write config.toml, the key and the certificate (0600). Returns (config,
    the certificate's expiry). With `expect_site`, a token whose pool is in another site
    is refused before anything is written."""
    document = fetch_wellknown(server)
    check_wellknown(document, pins)
    join_url = document.get("gatewayJoinUrl")
    if not join_url:
        raise JoinError("the control plane publishes no join gateway (gatewayJoinUrl)")
    gateway = session_gateway(document, gateway_url)
    name = hostname or (simulated_name(root) if sim else socket.gethostname())
    inventory = inventory_for(sim=sim, sim_gpus=sim_gpus, sim_variant=sim_variant,
                              hostname=name)
    report = inventory.report()
    request = prepare(token, document, name)
    reply = asyncio.run(_join_rpc(grpc_target(join_url), document["servingCaPem"].encode(),
                                  pb.JoinRequest(
        sealed_token=request.sealed_token, csr_der=request.csr_der,
        hardware=pb.Hardware(hostname=name, serial=report.get("serial", ""),
                             product_uuid=report.get("productUuid", ""),
                             macs=report.get("macs", [])))))
    if not reply.ok:
        raise JoinRefused(f"the control plane refused the join: {reply.message} (ask the "
                        "operator to check the audit log)")
    payload = verify_answer(json.loads(reply.signed_json), request, pins,
                            document["trustDomain"])
    if expect_site and payload["siteId"] != expect_site:
        raise JoinError(f"this token's pool is in site {payload['siteId']}, not {expect_site}:"
                        " nothing was written; revoke the token and use one for this site")
    config = Config(server=server, gateway=gateway,
                    node_id=payload["nodeId"], site_id=payload["siteId"],
                    trust_domain=document["trustDomain"], serving_ca_pin=pins.serving_ca,
                    join_signing_pin=pins.join_signing, join_encryption_pin=pins.join_encryption,
                    root=str(root), sim=sim, sim_gpus=sim_gpus, sim_variant=sim_variant,
                    hostname=name, role=str(payload.get("role", "node")))
    paths = Paths(root)
    write_private(paths.key_file, request.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    write_private(paths.cert_file, payload["certificatePem"])
    write_private(paths.ca_file, payload["caPem"])
    config.write(paths.config_file)
    return config, payload["notAfter"]
