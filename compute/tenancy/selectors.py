"""Reads of tenants, principals and tokens. Each takes the acting tenant and filters by it."""

from __future__ import annotations

from django.db.models import QuerySet

from compute.errors import InvalidArgument, NotFound
from compute.guards import one_visible
from compute.tenancy.models import ROOT_TENANT_SLUG, ApiToken, Principal, Tenant


def tenant_resolve(value: object, *, principal: Principal) -> Tenant:
    """The tenant a call acts in: `tenantId` (an id or a slug), else the principal's own."""
    if value is None or value == "":
        return principal.tenant
    return tenant_by_ref(value)


def tenant_by_ref(value: object) -> Tenant:
    """A tenant named by its id (`tnt_…`) or its slug."""
    if not isinstance(value, str) or len(value) > 63:
        raise InvalidArgument("tenantId: must be a tenant id or slug", field="tenantId")
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
