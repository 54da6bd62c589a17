"""What the audit trail publishes in /.well-known/better-compute."""

from __future__ import annotations

from typing import Any

from audit.keys import public_key_b64


def contribute() -> dict[str, Any]:
    return {"auditSigningKey": {"alg": "Ed25519", "publicKey": public_key_b64()}}
