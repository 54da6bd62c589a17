"""Who is calling: a bearer API token, or a browser session that sent the CSRF header."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compute.errors import CsrfHeaderMissing, Unauthenticated
from compute.tenancy.models import Principal
from compute.tenancy.selectors import principal_for_token, principal_for_user

CSRF_HEADER = "X-Better-Compute"


def authenticate(headers: Mapping[str, str], *, user: Any = None) -> Principal:
    """The caller named by `Authorization: Bearer biam_…`, else by a signed-in session
    (`user`) whose request carries the CSRF header. `headers` match case-insensitively."""
    lowered = {key.lower(): value for key, value in headers.items()}
    header = lowered.get("authorization", "")
    if header:
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            raise Unauthenticated("Authorization must be 'Bearer biam_…'")
        return principal_for_token(credential.strip())
    if user is not None and user.is_authenticated:
        if CSRF_HEADER.lower() not in lowered:
            raise CsrfHeaderMissing(f"browser sessions must send the {CSRF_HEADER} header")
        return principal_for_user(user)
    raise Unauthenticated("missing credentials: send Authorization: Bearer biam_…")
