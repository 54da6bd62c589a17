"""JoinService: trade a sealed single-use token and a CSR for a node and a certificate.

The agent seals `bcjt_<id>.<secret>` to the join-encryption key in a JWE whose protected
header names sha256(CSR). One transaction locks the token row and checks, in order: the
secret (constant time), revocation, expiry at the database clock, uses left, role, and the
expect binding against the machine's hardware identity. Every refusal looks the same to the
agent; only the audit event carries the reason. This path never calls IAM.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from audit.services import audit_denied, audit_record, audited
from bcd.contract.bmc import same_uuid
from bcd.contract.crypto import BadJwe, jwe_open, public_pem, sign_document, spki_pin
from compute.core import secrets
from compute.core.db import database_now
from compute.core.errors import ComputeError, InvalidState
from compute.platform.tenancy.selectors import root_tenant
from fleet.models import JoinToken, Node, NodeRole, ProvisionState, SpentSeal
from fleet.pki import issue_node_certificate, pki, spiffe_id
from fleet.services.deploy import deploy_join_locked
from fleet.services.join_tokens import TOKEN_SCHEME
from fleet.services.nodes import node_create_locked


class JoinRefused(ComputeError):
    """The one answer an agent gets for any refused join."""

    code = "join_refused"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"

    def __init__(self) -> None:
        super().__init__("join refused")


@dataclass(frozen=True)
class Hardware:
    hostname: str = ""
    serial: str = ""
    product_uuid: str = ""
    macs: tuple[str, ...] = ()


class _Refusal(Exception):
    def __init__(self, reason: str, token: JoinToken | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.token = token


def join_redeem(*, sealed_token: str, csr_der: bytes, hardware: Hardware) -> dict[str, str]:
    """Verify a join and answer with a document signed by the join-signing key."""
    try:
        return _redeem(sealed_token, csr_der, hardware)
    except _Refusal as refusal:
        token = refusal.token
        audit_denied(tenant_id=token.pool.tenant_id if token else root_tenant().id,
                     actor_id=token.id if token else "join", action="node.join",
                     target=token.id if token else "", reason=refusal.reason,
                     data={"hostname": hardware.hostname, "serial": hardware.serial})
        raise JoinRefused() from None


def _open(sealed_token: str, csr_der: bytes) -> tuple[str, str, x509.CertificateSigningRequest]:
    try:
        header, plaintext = jwe_open(sealed_token, pki().join_encryption_key)
    except BadJwe as error:
        raise _Refusal(f"the token is not sealed to this control plane's key ({error})") \
            from None
    if header.get("csr_sha256") != hashlib.sha256(csr_der).hexdigest():
        raise _Refusal("the sealed token names another CSR")
    try:
        csr = x509.load_der_x509_csr(csr_der)
    except ValueError:
        raise _Refusal("the CSR cannot be parsed") from None
    parts = secrets.split(TOKEN_SCHEME, plaintext.decode(errors="replace"))
    if parts is None:
        raise _Refusal("the sealed value is not a join token")
    return parts[0], parts[1], csr


@audited
def _redeem(sealed_token: str, csr_der: bytes, hardware: Hardware) -> dict[str, str]:
    token_id, secret, csr = _open(sealed_token, csr_der)
    seal = hashlib.sha256(sealed_token.encode()).hexdigest()
    token = (JoinToken.objects.select_for_update(no_key=True, of=("self",)).select_related("pool")
             .filter(pk=token_id).first())
    if not secrets.matches(secret, token.secret_sha256 if token else None) or token is None:
        raise _Refusal("unknown token or wrong secret", token)
    now = database_now()
    key_pin = spki_pin(csr.public_key())
    if token.revoked_at is not None:
        raise _Refusal("the token is revoked", token)
    if token.expires_at <= now:
        raise _Refusal("the token has expired", token)
    if token.role not in NodeRole.values:
        raise _Refusal(f"the token's role {token.role} cannot join nodes", token)
    if SpentSeal.objects.filter(pk=seal).exists():
        raise _Refusal("this sealed token was already used (a replay)", token)
    SpentSeal.objects.create(digest=seal, token=token)
    _check_binding(token, hardware)
    node = _rejoining_node(token, key_pin, hardware) if token.adopts_id is None else None
    if token.adopts_id is not None:  # the OS a deploy wrote joins as the enrolled machine
        if token.uses >= token.max_uses:
            raise _Refusal("the deploy's token was used already", token)
        try:
            node = deploy_join_locked(token)
        except InvalidState as error:
            raise _Refusal(error.message, token) from None
        token.uses += 1
        token.nodes = [*token.nodes, node.id]
        token.save(update_fields=["uses", "nodes"])
    elif node is None:
        if token.uses >= token.max_uses:
            raise _Refusal("the token has no uses left", token)
        token.uses += 1
        node = node_create_locked(pool=token.pool, hostname=hardware.hostname,
                                  serial=hardware.serial, product_uuid=hardware.product_uuid,
                                  macs=hardware.macs, role=token.role)
        token.nodes = [*token.nodes, node.id]
        token.save(update_fields=["uses", "nodes"])
    try:
        certificate = issue_node_certificate(csr, site_id=node.site_id, node_id=node.id, now=now)
    except ValueError as error:
        raise _Refusal(str(error), token) from None
    node.key_pin = key_pin
    node.public_key = public_pem(csr.public_key())
    node.certificate_not_after = certificate.not_valid_after_utc
    node.save(update_fields=["key_pin", "public_key", "certificate_not_after"])
    audit_record(tenant_id=token.pool.tenant_id, actor_id=token.id, action="node.join",
                 target=node.id, data={"tokenId": token.id, "usesLeft":
                                       token.max_uses - token.uses}, reason="token accepted")
    return sign_document(pki().join_signing_key, _response(node, certificate, csr_der))


def _check_binding(token: JoinToken, hardware: Hardware) -> None:
    if token.expect_serial and hardware.serial != token.expect_serial:
        raise _Refusal("the machine's serial does not match the token's binding", token)
    if token.expect_product_uuid and not same_uuid(hardware.product_uuid,
                                                   token.expect_product_uuid):
        raise _Refusal("the machine's product UUID does not match the token's binding", token)
    if token.expect_mac and token.expect_mac not in {m.lower() for m in hardware.macs}:
        raise _Refusal("none of the machine's MACs matches the token's binding", token)
    if not hardware.serial and not hardware.product_uuid and not token.bound:
        raise _Refusal("the machine reports no serial or product UUID and the token has no "
                       "expect binding", token)


def _rejoining_node(token: JoinToken, key_pin: str, hardware: Hardware) -> Node | None:
    """The node this same machine (same key, same hardware) joined as before, if any."""
    same = Node.objects.select_for_update(no_key=True).filter(
        pool=token.pool, key_pin=key_pin).exclude(provision_state=ProvisionState.RETIRED)
    for node in same:
        if (node.serial, node.product_uuid) == (hardware.serial, hardware.product_uuid):
            return node
    return None


def _response(node: Node, certificate: x509.Certificate, csr_der: bytes) -> dict[str, Any]:
    authority = pki()
    return {
        "nodeId": node.id, "siteId": node.site_id, "poolId": node.pool_id, "role": node.role,
        "spiffeId": spiffe_id(authority.trust_domain, node.site_id, node.id),
        "certificatePem": certificate.public_bytes(serialization.Encoding.PEM).decode(),
        "caPem": authority.ca_pem, "csrSha256": hashlib.sha256(csr_der).hexdigest(),
        "notAfter": certificate.not_valid_after_utc.isoformat(),
    }


class RenewRefused(ComputeError):
    code = "renew_refused"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"


@audited
def node_certificate_renew(*, node_id: str, csr_der: bytes) -> str:
    """A fresh 24 h certificate for the node's *same* key (its CSR proves possession)."""
    node = (Node.objects.select_for_update(no_key=True, of=("self",)).select_related("pool")
            .filter(pk=node_id).first())
    try:
        csr = x509.load_der_x509_csr(csr_der)
    except ValueError:
        raise RenewRefused("renewal refused") from None
    if (node is None or node.provision_state == ProvisionState.RETIRED
            or spki_pin(csr.public_key()) != node.key_pin):
        raise RenewRefused("renewal refused")
    certificate = issue_node_certificate(csr, site_id=node.site_id, node_id=node.id,
                                         now=database_now())
    node.certificate_not_after = certificate.not_valid_after_utc
    node.save(update_fields=["certificate_not_after"])
    audit_record(tenant_id=node.pool.tenant_id, actor_id=node.id, action="node.renew",
                 target=node.id, data={"notAfter": node.certificate_not_after},
                 reason="same key")
    return certificate.public_bytes(serialization.Encoding.PEM).decode()
