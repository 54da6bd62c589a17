"""The fleet PKI: a serving CA, a join-signing key and a join-encryption key (all P-256).

Generated on first use and kept as one sealed bundle in Postgres (see audit.sealing).
The CA signs node certificates (24 h, URI SAN spiffe://<trust domain>/site/<site>/node/<id>)
and the gateway's serving certificate; the gateway itself never holds a CA or signing key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from ipaddress import ip_address

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.conf import settings

from audit.sealing import sealed_secret
from bcd.contract.crypto import public_jwk, spki_pin

BUNDLE_NAME = "pki-bundle"
NODE_CERT_LIFETIME = timedelta(hours=24)
CLOCK_SKEW = timedelta(minutes=5)


def trust_domain() -> str:
    return str(settings.BC_TRUST_DOMAIN)


def _pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _new_bundle() -> bytes:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "better-compute serving CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain())])
    now = datetime.now(UTC)
    ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + timedelta(days=3650))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(
                   digital_signature=True, key_cert_sign=True, crl_sign=True,
                   content_commitment=False, key_encipherment=False, data_encipherment=False,
                   key_agreement=False, encipher_only=False, decipher_only=False),
                   critical=True)
               .sign(ca_key, hashes.SHA256()))
    bundle = {"servingCaKey": _pem(ca_key),
              "servingCaCert": ca_cert.public_bytes(serialization.Encoding.PEM).decode(),
              "joinSigningKey": _pem(ec.generate_private_key(ec.SECP256R1())),
              "joinEncryptionKey": _pem(ec.generate_private_key(ec.SECP256R1())),
              "trustDomain": trust_domain()}
    return json.dumps(bundle).encode()


@dataclass(frozen=True)
class Pki:
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    join_signing_key: ec.EllipticCurvePrivateKey
    join_encryption_key: ec.EllipticCurvePrivateKey
    trust_domain: str

    @property
    def ca_pem(self) -> str:
        return self.ca_cert.public_bytes(serialization.Encoding.PEM).decode()

    def pins(self) -> dict[str, str]:
        return {"servingCaSpkiPin": spki_pin(self.ca_cert.public_key()),
                "joinSigningKeyPin": spki_pin(self.join_signing_key.public_key()),
                "joinEncryptionKeyPin": spki_pin(self.join_encryption_key.public_key())}

    def published(self) -> dict[str, object]:
        """What /.well-known/better-compute says about the PKI: public halves and pins."""
        return {"trustDomain": self.trust_domain, "servingCaPem": self.ca_pem,
                "joinEncryptionKey": public_jwk(self.join_encryption_key.public_key()),
                **self.pins()}


def _load(raw: bytes) -> Pki:
    data = json.loads(raw)

    def key(name: str) -> ec.EllipticCurvePrivateKey:
        loaded = serialization.load_pem_private_key(data[name].encode(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{name} in the PKI bundle is not an EC key")
        return loaded

    return Pki(ca_key=key("servingCaKey"),
               ca_cert=x509.load_pem_x509_certificate(data["servingCaCert"].encode()),
               join_signing_key=key("joinSigningKey"),
               join_encryption_key=key("joinEncryptionKey"), trust_domain=data["trustDomain"])


@lru_cache(maxsize=1)
def _cached(raw: bytes) -> Pki:
    return _load(raw)


def pki() -> Pki:
    return _cached(sealed_secret(BUNDLE_NAME, _new_bundle))


def spiffe_id(trust: str, site_id: str, node_id: str) -> str:
    return f"spiffe://{trust}/site/{site_id}/node/{node_id}"


def issue_node_certificate(csr: x509.CertificateSigningRequest, *, site_id: str,
                           node_id: str, now: datetime) -> x509.Certificate:
    """A 24 h client certificate for the node's own key, role node."""
    authority = pki()
    if not csr.is_signature_valid:
        raise ValueError("the CSR signature does not verify")
    public_key = csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or public_key.curve.name != \
            "secp256r1":
        raise ValueError("node keys must be EC P-256")
    uri = spiffe_id(authority.trust_domain, site_id, node_id)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([
                x509.NameAttribute(NameOID.COMMON_NAME, node_id),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "node")]))
            .issuer_name(authority.ca_cert.subject).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + NODE_CERT_LIFETIME)
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(authority.ca_key, hashes.SHA256()))


def issue_gateway_certificate(hosts: list[str]) -> tuple[str, str]:
    """(key PEM, certificate PEM) for the gateway's TLS listener, valid 30 days."""
    authority = pki()
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(authority.ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(authority.ca_key, hashes.SHA256()))
    return _pem(key), cert.public_bytes(serialization.Encoding.PEM).decode()
