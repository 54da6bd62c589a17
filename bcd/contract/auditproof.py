"""The audit trail's wire formats: canonical event bytes, checkpoint statements, proofs.

`check_proof` is the small offline verifier: given a proof document (from `audit.prove`)
and the audit signing key's public half (from `/.well-known/better-compute`), it says
whether the event is in the signed log, using nothing but this module and `cryptography`.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from bcd.contract.merkle import leaf_hash, verify_inclusion

EVENT_FIELDS = ("v", "tenantId", "position", "id", "actorId", "action", "target", "allowed",
                "reason", "decisionId", "requestId", "origin", "data", "createdAt")


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: one byte string per value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def event_leaf(event: dict[str, Any]) -> bytes:
    """The RFC 6962 leaf hash of an audit event in its wire form."""
    missing = [f for f in EVENT_FIELDS if f not in event]
    if missing:
        raise ValueError(f"event lacks {', '.join(missing)}")
    return leaf_hash(canonical_json({f: event[f] for f in EVENT_FIELDS}))


def checkpoint_statement(*, tenant_id: str, tree_size: int, root_hash: str,
                         previous_id: str | None, signed_at: str) -> bytes:
    """The exact bytes a checkpoint's signature covers."""
    return (f"better-compute audit checkpoint v1\ntenant {tenant_id}\nsize {tree_size}\n"
            f"root {root_hash}\nprevious {previous_id or '-'}\nsigned {signed_at}\n").encode()


def verify_statement(public_key_b64: str, statement: bytes, signature_b64: str) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64))
        key.verify(base64.b64decode(signature_b64), statement)
    except (InvalidSignature, ValueError):
        return False
    return True


def check_proof(document: dict[str, Any], public_key_b64: str) -> tuple[bool, str]:
    """Verify an inclusion proof document offline: (ok, what was checked or what failed)."""
    try:
        checkpoint = document["checkpoint"]
        event = document["event"]
        statement = checkpoint_statement(
            tenant_id=checkpoint["tenantId"], tree_size=checkpoint["treeSize"],
            root_hash=checkpoint["rootHash"], previous_id=checkpoint["previous"],
            signed_at=checkpoint["signedAt"])
        if not verify_statement(public_key_b64, statement, checkpoint["signature"]):
            return False, "the checkpoint signature does not verify with this public key"
        if event["tenantId"] != checkpoint["tenantId"]:
            return False, "the event belongs to another tenant than the checkpoint"
        index, size = document["leafIndex"], checkpoint["treeSize"]
        if index != event["position"] - 1:
            return False, "the leaf index does not match the event's position"
        path = [bytes.fromhex(h) for h in document["auditPath"]]
        if not verify_inclusion(event_leaf(event), index, size, path,
                                bytes.fromhex(checkpoint["rootHash"])):
            return False, "the event is not in the signed tree (hash path does not match)"
    except (KeyError, TypeError, ValueError) as error:
        return False, f"malformed proof document: {error}"
    return True, (f"event {event['id']} is entry {event['position']} of {size} in tenant "
                  f"{event['tenantId']}'s log, signed at {checkpoint['signedAt']}")
