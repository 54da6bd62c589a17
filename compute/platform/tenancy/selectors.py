"""Reads of tenants, principals and tokens. Each takes the acting tenant and filters by it."""

from __future__ import annotations

import re

from django.db.models import Q, QuerySet
from django.utils import timezone

from compute.core import secrets
from compute.core.db import from_row, prepared_cursor, select_list
from compute.core.errors import InvalidArgument, NotFound, Unauthenticated
from compute.core.sqltext import tables
from compute.platform.guards import one_visible
from compute.platform.tenancy.models import (
    ROOT_TENANT_SLUG,
    TOKEN_SCHEME,
    ApiToken,
    Principal,
    RoleBinding,
    Tenant,
)


def principal_for_token(presented: str) -> Principal:
    """Resolve `biam_<id>.<secret>`; every failure is the same 401 to the caller."""
    parts = secrets.split(TOKEN_SCHEME, presented)
    token = _token_with_principal(parts[0]) if parts is not None else None
    ok = secrets.matches(parts[1] if parts else "", token.secret_sha256 if token else None)
    if not ok or token is None:
        raise Unauthenticated("invalid API token")
    return _live_principal(token)


CALLER_SQL = tables("""
SELECT {token}, {principal}, {tenant} FROM {ApiToken} k
  JOIN {Principal} p ON p.id = k.principal_id JOIN {Tenant} n ON n.id = p.tenant_id
 WHERE k.id = %s""", ApiToken=ApiToken, Principal=Principal, Tenant=Tenant)


def _token_with_principal(token_id: str) -> ApiToken | None:
    """The token with its principal and the principal's tenant, in one prepared statement
    (every API call asks this first)."""
    sql = CALLER_SQL.format(token=select_list(ApiToken, "k"),
                           principal=select_list(Principal, "p"),
                           tenant=select_list(Tenant, "n"))
    with prepared_cursor() as cursor:
        cursor.execute(sql, [token_id])
        row = cursor.fetchone()
    if row is None:
        return None
    sizes = [len(m._meta.concrete_fields) for m in (ApiToken, Principal)]
    token = from_row(ApiToken, row[:sizes[0]])
    token.principal = from_row(Principal, row[sizes[0]:sum(sizes)])
    token.principal.tenant = from_row(Tenant, row[sum(sizes):])
    return token


def principal_for_token_id(token_id: str) -> Principal:
    """The principal of a token known by its id alone (a console session keeps only that),
    while the token is live."""
    token = ApiToken.objects.select_related("principal__tenant").filter(pk=token_id).first()
    if token is None:
        raise Unauthenticated("invalid API token")
    return _live_principal(token)


def _live_principal(token: ApiToken) -> Principal:
    if token.revoked_at is not None:
        raise Unauthenticated("API token revoked")
    if token.expires_at is not None and token.expires_at <= timezone.now():
        raise Unauthenticated("API token expired")
    if token.principal.disabled_at is not None:
        raise Unauthenticated("principal disabled")
    return token.principal


def principal_for_user(user: object) -> Principal:
    """The principal of a signed-in browser session's user."""
    principal = Principal.objects.select_related("tenant").filter(user=user).first()
    if principal is None or principal.disabled_at is not None:
        raise Unauthenticated("this session's user has no principal")
    return principal


def principal_by_id(principal_id: str) -> Principal:
    """A live principal by its id (a console session signed in with OpenID Connect keeps
    only that)."""
    principal = Principal.objects.select_related("tenant").filter(pk=principal_id).first()
    if principal is None or principal.disabled_at is not None:
        raise Unauthenticated("this session's principal is gone or disabled")
    return principal


class TenantOutOfReach(NotFound):
    """A tenant that exists but that the caller has no standing in: answered exactly as a
    tenant that does not exist, so existence never leaks."""


def tenant_resolve(value: object, *, principal: Principal) -> Tenant:
    """The tenant a call acts in: `tenantId` (an id or a slug), else the principal's own.

    One the principal has no role in (and no root role) is TenantOutOfReach.
    """
    if value is None or value == "":
        return principal.tenant
    tenant = tenant_by_ref(value)
    if tenant.pk != principal.tenant_id and not RoleBinding.objects.filter(
            Q(tenant=tenant) | Q(tenant__slug=ROOT_TENANT_SLUG), principal=principal).exists():
        raise TenantOutOfReach(f"tenant {value!r} not found", tenantId=value)
    return tenant


_TENANT_REF = re.compile(r"[A-Za-z0-9_-]{1,63}")


def tenant_by_ref(value: object) -> Tenant:
    """A tenant named by its id (`tnt_…`) or its slug."""
    if not isinstance(value, str) or not _TENANT_REF.fullmatch(value):
        raise InvalidArgument("tenantId: must be a tenant id or slug (letters, digits, - and _, "
                              "at most 63)", field="tenantId")
    field = "pk" if value.startswith("tnt_") else "slug"
    tenant = Tenant.objects.filter(**{field: value}).first()
    if tenant is None:
        raise NotFound(f"tenant {value!r} not found", tenantId=value)
    return tenant


def root_tenant() -> Tenant:
    return Tenant.objects.get(slug=ROOT_TENANT_SLUG)


def tenant_list(*, tenant: Tenant) -> QuerySet[Tenant]:
    """The root tenant sees every tenant; any other sees itself."""
    if tenant.is_root:
        return Tenant.objects.all()
    return Tenant.objects.filter(pk=tenant.pk)


def token_list(*, tenant: Tenant) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(principal__tenant=tenant).select_related("principal")


def access_token_by_id(*, tenant: Tenant, token_id: str, lock: bool = False) -> ApiToken:
    return one_visible(token_list(tenant=tenant), token_id, noun="token", field="tokenId",
                       lock=lock)


def principal_roles(principal: Principal) -> list[dict[str, str]]:
    return [{"tenantId": b.tenant_id, "tenant": b.tenant.slug, "role": b.role}
            for b in principal.bindings.select_related("tenant").order_by("created_at")]


def principal_names(ids: list[str]) -> dict[str, str]:
    """Principals' names by id (an audit row names its actor by id)."""
    return dict(Principal.objects.filter(pk__in=ids).values_list("id", "name"))
