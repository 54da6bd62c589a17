"""The audit signing key: Ed25519, kept sealed in Postgres, public half published."""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.sealing import sealed_secret

AUDIT_KEY_NAME = "audit-signing-key"


def _new_key() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
        serialization.NoEncryption())


def signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(sealed_secret(AUDIT_KEY_NAME, _new_key))


def public_key_b64() -> str:
    raw = signing_key().public_key().public_bytes(serialization.Encoding.Raw,
                                                  serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def sign(statement: bytes) -> str:
    return base64.b64encode(signing_key().sign(statement)).decode()
