"""Proof Key for Code Exchange (RFC 7636): a fresh verifier and its S256 challenge, for the
console's and the CLI's sign-in with an OpenID Connect issuer."""

from __future__ import annotations

import base64
import hashlib
import secrets


def pkce_pair() -> tuple[str, str]:
    """(verifier, challenge): the challenge goes with the authorization request, the verifier
    with the code's exchange."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(
        hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge
