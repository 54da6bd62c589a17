"""The agent's half of the join: a fresh key and CSR, the sealed token, and the checks of
the signed answer (pin, CSR hash, SPIFFE SAN, chain to the pinned serving CA)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bcd.contract.crypto import BadSignature, jwe_seal, jwk_public_key, open_document, spki_pin


class JoinError(Exception):
    """The join cannot go on; the message says why, for the operator."""


class JoinRefused(JoinError):
    """The control plane answered and refused: asking again gets the same answer (and one
    more audited refusal from this address)."""


@dataclass(frozen=True)
class Pins:
    serving_ca: str
    join_signing: str
    join_encryption: str


@dataclass(frozen=True)
class JoinRequest:
    key: ec.EllipticCurvePrivateKey
    csr_der: bytes
    sealed_token: str


def check_wellknown(document: dict[str, Any], pins: Pins) -> None:
    """Refuse a well-known document whose published pins differ from the operator's."""
    published = {"servingCaSpkiPin": pins.serving_ca, "joinSigningKeyPin": pins.join_signing,
                 "joinEncryptionKeyPin": pins.join_encryption}
    for name, expected in published.items():
        if document.get(name) != expected:
            raise JoinError(f"the server publishes {name} {document.get(name)!r}, not the "
                            f"pinned {expected!r}: refusing to join")
    ca = x509.load_pem_x509_certificate(document["servingCaPem"].encode())
    if spki_pin(ca.public_key()) != pins.serving_ca:
        raise JoinError("the published serving CA does not match its pin")
    key = jwk_public_key(document["joinEncryptionKey"])
    if spki_pin(key) != pins.join_encryption:
        raise JoinError("the published join-encryption key does not match its pin")


def csr_for(key: ec.EllipticCurvePrivateKey, common_name: str) -> bytes:
    """A DER certificate signing request for `key` (it proves the key is held)."""
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
           .sign(key, hashes.SHA256()))
    return bytes(csr.public_bytes(serialization.Encoding.DER))


def prepare(token: str, document: dict[str, Any], hostname: str) -> JoinRequest:
    key = ec.generate_private_key(ec.SECP256R1())
    csr_der = csr_for(key, hostname)
    sealed = jwe_seal(token.strip().encode(), jwk_public_key(document["joinEncryptionKey"]),
                      {"csr_sha256": hashlib.sha256(csr_der).hexdigest()})
    return JoinRequest(key=key, csr_der=csr_der, sealed_token=sealed)


def verify_answer(envelope: dict[str, str], request: JoinRequest, pins: Pins,
                  trust_domain: str) -> dict[str, Any]:
    """The join answer's payload, once every check passed."""
    try:
        payload = open_document(envelope, pin=pins.join_signing)
    except BadSignature as error:
        raise JoinError(str(error)) from None
    if payload.get("csrSha256") != hashlib.sha256(request.csr_der).hexdigest():
        raise JoinError("the answer is for another CSR")
    ca = x509.load_pem_x509_certificate(payload["caPem"].encode())
    if spki_pin(ca.public_key()) != pins.serving_ca:
        raise JoinError("the answer's CA does not match the serving CA pin")
    cert = x509.load_pem_x509_certificate(payload["certificatePem"].encode())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception) as error:  # InvalidSignature and friends
        raise JoinError(f"the certificate is not issued by the pinned CA: {error}") from None
    if spki_pin(cert.public_key()) != spki_pin(request.key.public_key()):
        raise JoinError("the certificate is not for this node's key")
    expected = (f"spiffe://{trust_domain}/site/{payload['siteId']}/node/{payload['nodeId']}")
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    if sans.get_values_for_type(x509.UniformResourceIdentifier) != [expected] or \
            payload.get("spiffeId") != expected:
        raise JoinError("the certificate's SPIFFE ID does not name this node")
    return payload
