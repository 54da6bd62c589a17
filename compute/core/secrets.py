"""Bearer secrets: `<scheme>_<object id>.<secret>`, stored as SHA-256, checked in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets

_SECRET_BYTES = 32
_DUMMY_DIGEST = hashlib.sha256(b"no such token").hexdigest()


def mint(scheme: str, object_id: str) -> tuple[str, str]:
    """Return (`<scheme>_<object_id>.<secret>`, sha256 hex of the secret)."""
    secret = secrets.token_urlsafe(_SECRET_BYTES)
    return f"{scheme}_{object_id}.{secret}", digest(secret)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split(scheme: str, presented: str) -> tuple[str, str] | None:
    """Split a presented token into (object id, secret), or None when it is malformed."""
    prefix = f"{scheme}_"
    if not presented.startswith(prefix):
        return None
    object_id, sep, secret = presented[len(prefix):].partition(".")
    if not sep or not object_id or not secret or len(presented) > 256:
        return None
    return object_id, secret


def matches(secret: str, stored_digest: str | None) -> bool:
    """Constant-time check; a missing row is compared against a dummy so timing leaks nothing."""
    return hmac.compare_digest(digest(secret), stored_digest or _DUMMY_DIGEST) and bool(
        stored_digest)
