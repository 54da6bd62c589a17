"""Who is calling: a bearer API token (or an OpenID Connect JWT where an issuer is
configured), or a console session that sent the CSRF header.

A console session stands for a principal in one of two ways: it keeps the *id* of the API
token it was signed in with (never its secret), or it is a signed-in Django user with a
principal. Either is re-checked on every request, so revoking the token, or disabling the
principal, signs the browser out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from compute.core.errors import CsrfHeaderMissing, PermissionDenied, Unauthenticated
from compute.http.fair import learn
from compute.platform.iam import oidc
from compute.platform.iam.refusals import authentication_failed, authentication_throttled
from compute.platform.tenancy.models import Principal
from compute.platform.tenancy.selectors import (
    principal_by_id,
    principal_for_token,
    principal_for_token_id,
    principal_for_user,
)
from compute.platform.tenancy.services import oidc_principal

CSRF_HEADER = "X-Better-Compute"
CSRF_VALUE = "1"
SESSION_TOKEN_KEY = "console_token_id"  # noqa: S105  (a session key name, no secret)
SESSION_OIDC = "console_oidc"  # {"principal", "expires"}: a sign-in with OpenID Connect


def session_principal(session: MutableMapping[str, Any] | None, user: Any = None) -> Principal:
    """The principal a console session stands for; a session whose token has been revoked
    or has expired forgets it."""
    signed = session.get(SESSION_OIDC) if session is not None else None
    if signed:  # it lasts as long as the ID token it was made from
        if signed["expires"] <= time.time():
            session.pop(SESSION_OIDC, None)  # type: ignore[union-attr]
            raise Unauthenticated("the sign-in has expired: sign in again")
        return principal_by_id(str(signed["principal"]))
    token_id = session.get(SESSION_TOKEN_KEY) if session is not None else None
    if token_id:
        try:
            return principal_for_token_id(token_id)
        except Unauthenticated:
            session.pop(SESSION_TOKEN_KEY, None)  # type: ignore[union-attr]
            raise
    if user is not None and user.is_authenticated:
        return principal_for_user(user)
    raise Unauthenticated("not signed in")


def bearer_principal(credential: str) -> Principal:
    """An API token's principal, or, where an OpenID Connect issuer is configured, a JWT's
    (compute.platform.iam.oidc)."""
    if oidc.configured() and oidc.looks_like_jwt(credential):
        return oidc_principal(oidc.identity_of(credential))
    return principal_for_token(credential)


def authenticate(headers: Mapping[str, str], *, session: MutableMapping[str, Any] | None = None,
                 user: Any = None, address: str = "") -> Principal:
    """The caller named by `Authorization: Bearer biam_…`, else by a console session whose
    request carries the CSRF header. `headers` match case-insensitively. A bad token counts
    against its source `address` (compute.platform.iam.refusals): past the limit, 429."""
    lowered = {key.lower(): value for key, value in headers.items()}
    header = lowered.get("authorization", "")
    if header:
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            raise Unauthenticated("Authorization must be 'Bearer biam_…'")
        authentication_throttled(address)
        try:
            principal = bearer_principal(credential.strip())
        except Unauthenticated:
            authentication_failed(address)
            raise
        learn(credential.strip(), principal.tenant_id)
        return principal
    signed_in = bool(session and (session.get(SESSION_TOKEN_KEY) or session.get(
        SESSION_OIDC))) or bool(
        user is not None and user.is_authenticated)
    if signed_in:
        if lowered.get(CSRF_HEADER.lower()) != CSRF_VALUE:
            raise CsrfHeaderMissing(f"browser sessions must send {CSRF_HEADER}: {CSRF_VALUE}")
        origin = lowered.get("origin")
        if origin is not None and urlsplit(origin).netloc != lowered.get("host"):
            raise PermissionDenied(f"a call from {origin[:100]!r} may not use this site's "
                                   "session")
        return session_principal(session, user)
    raise Unauthenticated("missing credentials: send Authorization: Bearer biam_…")
