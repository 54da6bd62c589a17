"""Who is calling: a bearer API token, or a browser session that sent the CSRF header."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils import timezone

from compute import secrets
from compute.errors import CsrfHeaderMissing, Unauthenticated
from compute.tenancy.models import ApiToken, Principal

TOKEN_SCHEME = "biam"  # noqa: S105 (the token prefix, not a secret)
CSRF_HEADER = "X-Better-Compute"


def principal_for_token(presented: str) -> Principal:
    """Resolve `biam_<id>.<secret>`; every failure is the same 401 to the caller."""
    parts = secrets.split(TOKEN_SCHEME, presented)
    token = None
    if parts is not None:
        token = ApiToken.objects.select_related("principal__tenant").filter(pk=parts[0]).first()
    ok = secrets.matches(parts[1] if parts else "", token.secret_sha256 if token else None)
    if not ok or token is None:
        raise Unauthenticated("invalid API token")
    if token.revoked_at is not None:
        raise Unauthenticated("API token revoked")
    if token.expires_at is not None and token.expires_at <= timezone.now():
        raise Unauthenticated("API token expired")
    if token.principal.disabled_at is not None:
        raise Unauthenticated("principal disabled")
    return token.principal


def authenticate(request: HttpRequest) -> Principal:
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            raise Unauthenticated("Authorization must be 'Bearer biam_…'")
        return principal_for_token(credential.strip())
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if CSRF_HEADER not in request.headers:
            raise CsrfHeaderMissing(f"browser sessions must send the {CSRF_HEADER} header")
        principal = Principal.objects.select_related("tenant").filter(user=user).first()
        if principal is None or principal.disabled_at is not None:
            raise Unauthenticated("this session's user has no principal")
        return principal
    raise Unauthenticated("missing credentials: send Authorization: Bearer biam_…")
