"""OpenID Connect bearer tokens: a JWT from the configured issuer, verified against the
issuer's published keys (JWKS), its audience and its expiry, then mapped to role bindings by
its groups. As the Kubernetes API server does, the token may be an ID token (audience: the
client id) or an access token where the IdP issues JWTs; the session ends when the token
does.

BETTER_COMPUTE_OIDC_ISSUER names the issuer (its discovery document and keys are read from
it, cached, and read again when a token names an unknown key); BETTER_COMPUTE_OIDC_AUDIENCE
the audience a token must carry; BETTER_COMPUTE_OIDC_ROLES maps groups to a role in a tenant
(`gpu-ops=root:operator,ml-team=acme:member`), read from the claim
BETTER_COMPUTE_OIDC_GROUPS_CLAIM (`groups`).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from django.conf import settings

from compute.core.errors import Unauthenticated

logger = logging.getLogger("compute.platform.iam.oidc")
ROLE_ORDER = ("viewer", "member", "operator", "admin")
KEYS_FOR = 300.0  # seconds a fetched key set is trusted before it is read again
REFETCH_AFTER = 30.0  # an unknown key id reads the set again at most this often


@dataclass(frozen=True)
class Identity:
    issuer: str
    subject: str
    name: str
    roles: dict[str, str]  # tenant slug -> role
    expires_at: float


def configured() -> bool:
    return bool(settings.BC_OIDC_ISSUER)


def accepted_audiences() -> list[str]:
    """The audiences a token may carry (the console's client id first, then others such as
    the CLI's)."""
    return [a.strip() for a in settings.BC_OIDC_AUDIENCE.split(",") if a.strip()]


def looks_like_jwt(credential: str) -> bool:
    return credential.count(".") == 2 and not credential.startswith("biam_")


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _uint(part: str) -> int:
    return int.from_bytes(_b64(part), "big")


class KeySet:
    """The issuer's signing keys by key id, read from its discovery document's jwks_uri."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, Any] = {}
        self._read_at = 0.0
        self._issuer = ""

    def candidates(self, kid: str) -> list[Any]:
        """The key named `kid`; for a token that names none, every key of the set."""
        now = time.monotonic()
        with self._lock:
            stale = now - self._read_at > KEYS_FOR or self._issuer != settings.BC_OIDC_ISSUER
            unknown = kid not in self._keys and now - self._read_at > REFETCH_AFTER
            if stale or (kid and unknown):
                self._keys, self._read_at = self._read(), now
                self._issuer = settings.BC_OIDC_ISSUER
            found = [self._keys[kid]] if kid in self._keys else (
                [] if kid else list(self._keys.values()))
        if not found:
            raise Unauthenticated("the token is signed with a key the issuer does not publish")
        return found

    @staticmethod
    def _read() -> dict[str, Any]:
        import httpx

        try:
            keys = httpx.get(discovery()["jwks_uri"], timeout=10).json()["keys"]
            return {str(jwk.get("kid", "")): public_key(jwk) for jwk in keys
                    if jwk.get("use", "sig") == "sig"}
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as error:
            logger.warning("the OIDC issuer's keys cannot be read: %s", error)
            raise Unauthenticated("the issuer's keys cannot be read") from None


def discovery() -> dict[str, Any]:
    """The issuer's discovery document (endpoints and the key set's address)."""
    import httpx

    issuer = settings.BC_OIDC_ISSUER.rstrip("/")
    try:
        found = httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=10).json()
    except (httpx.HTTPError, ValueError) as error:
        logger.warning("the OIDC issuer %s does not answer: %s", issuer, error)
        raise Unauthenticated("the sign-in service does not answer") from None
    if not isinstance(found, dict):
        raise Unauthenticated("the sign-in service's discovery document is not an object")
    return found


def public_key(jwk: dict[str, Any]) -> Any:
    if jwk.get("kty") == "RSA":
        return rsa.RSAPublicNumbers(_uint(jwk["e"]), _uint(jwk["n"])).public_key()
    if jwk.get("kty") == "EC" and jwk.get("crv") == "P-256":
        return ec.EllipticCurvePublicNumbers(_uint(jwk["x"]), _uint(jwk["y"]),
                                             ec.SECP256R1()).public_key()
    return None


KEYS = KeySet()


def verified_claims(token: str) -> dict[str, Any]:
    """The token's claims once its signature, issuer, audience and times check out; every
    failure is Unauthenticated naming what is wrong."""
    try:
        header_part, payload_part, signature_part = token.split(".")
        header = json.loads(_b64(header_part))
        claims = json.loads(_b64(payload_part))
        signature = _b64(signature_part)
    except ValueError:
        raise Unauthenticated("the bearer token is not a JWT") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise Unauthenticated("the bearer token is not a JWT: its parts are not objects")
    alg = header.get("alg")
    if alg not in ("RS256", "ES256"):
        raise Unauthenticated(f"the token's algorithm {alg!r} is not accepted (RS256, ES256)")
    signed = f"{header_part}.{payload_part}".encode()
    if not any(_verifies(key, alg, signature, signed)
               for key in KEYS.candidates(str(header.get("kid", "")))):
        raise Unauthenticated("the token's signature does not verify")
    if claims.get("iss") != settings.BC_OIDC_ISSUER.rstrip("/"):
        raise Unauthenticated("the token is from another issuer")
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if not set(audiences) & set(accepted_audiences()):
        raise Unauthenticated("the token is for another audience")
    now, leeway = time.time(), settings.BC_OIDC_LEEWAY_SECONDS
    if not isinstance(claims.get("exp"), int | float) or claims["exp"] + leeway <= now:
        raise Unauthenticated("the token has expired")
    if isinstance(claims.get("nbf"), int | float) and claims["nbf"] - leeway > now:
        raise Unauthenticated("the token is not valid yet")
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise Unauthenticated("the token names no subject")
    return claims


def _verifies(key: Any, alg: str, signature: bytes, signed: bytes) -> bool:
    try:
        if alg == "RS256" and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
            return True
        if alg == "ES256" and isinstance(key, ec.EllipticCurvePublicKey) and len(
                signature) == 64:
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"),
                                       int.from_bytes(signature[32:], "big"))
            key.verify(der, signed, ec.ECDSA(hashes.SHA256()))
            return True
    except InvalidSignature:
        return False
    return False


def role_mapping() -> dict[str, list[tuple[str, str]]]:
    """group -> [(tenant slug, role)], from BETTER_COMPUTE_OIDC_ROLES."""
    mapping: dict[str, list[tuple[str, str]]] = {}
    for entry in settings.BC_OIDC_ROLES.split(","):
        group, _, grant = entry.strip().partition("=")
        tenant, _, role = grant.partition(":")
        if group and tenant and role in ROLE_ORDER:
            mapping.setdefault(group, []).append((tenant, role))
    return mapping


def identity_of(token: str) -> Identity:
    """Who the token names and the roles its groups map to (the highest per tenant)."""
    claims = verified_claims(token)
    groups = claims.get(settings.BC_OIDC_GROUPS_CLAIM) or []
    if isinstance(groups, str):
        groups = [groups]
    roles: dict[str, str] = {}
    mapping = role_mapping()
    for group in groups if isinstance(groups, list) else []:
        for tenant, role in mapping.get(str(group), []):
            if ROLE_ORDER.index(role) > ROLE_ORDER.index(roles.get(tenant, "viewer")) \
                    or tenant not in roles:
                roles[tenant] = role
    name = str(claims.get("email") or claims.get("preferred_username") or claims["sub"])
    return Identity(claims["iss"], claims["sub"], name[:200], roles, float(claims["exp"]))
