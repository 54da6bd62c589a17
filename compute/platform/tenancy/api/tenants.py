"""API methods tenants.*."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import IdempotencyKeyField, Input, ListInput
from compute.core.api.registry import CallContext, Resource, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from compute.platform.tenancy.events import TenancyEvent
from compute.platform.tenancy.presenters import TENANT, present_tenant
from compute.platform.tenancy.selectors import root_tenant, tenant_list
from compute.platform.tenancy.services import tenant_create


class TenantCreateIn(Input):
    slug = serializers.SlugField(max_length=63)
    name = serializers.CharField(max_length=200, required=False, default="")
    idempotency_key = IdempotencyKeyField()


def _in_root(ctx: CallContext, data: dict[str, Any]) -> Resource:
    return Resource(kind="tenant", tenant_id=root_tenant().id)


@endpoint("tenants", "create", returns=TENANT, input=TenantCreateIn, mutating=True, draft=_in_root,
          emits=(TenancyEvent.TENANT_CREATED,))
def tenants_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Create a customer tenant (root administrators only)."""
    return present_tenant(tenant_create(actor=ctx.principal, **data))


class TenantGetIn(Input):
    pass


def _the_acting_tenant(ctx: CallContext, data: dict[str, Any]) -> Resource:
    return Resource(kind="tenant", tenant_id=ctx.tenant.id, id=ctx.tenant.id)


@endpoint("tenants", "get", returns=TENANT,
          input=TenantGetIn, mutating=False, draft=_the_acting_tenant)
def tenants_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The tenant the call acts in (`tenantId`, by default the caller's own)."""
    return present_tenant(ctx.tenant)


@endpoint("tenants", "list", returns=page_of(TENANT), input=ListInput, mutating=False)
def tenants_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Tenants visible from the acting tenant (root sees all)."""
    return page(tenant_list(tenant=ctx.tenant), present=present_tenant, **data)
