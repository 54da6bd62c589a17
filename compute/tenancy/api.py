"""API methods: system.whoami, tenants.*, tokens.*."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework import serializers

from compute.api.drafts import object_draft
from compute.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.api.registry import CallContext, endpoint
from compute.iam import Resource
from compute.paging import page
from compute.tenancy import selectors, services
from compute.tenancy.models import ApiToken, Role
from compute.tenancy.serializers import present_tenant, present_token


class WhoamiIn(Input):
    pass


@endpoint("system", "whoami", input=WhoamiIn, mutating=False)
def whoami(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Who the caller is, its tenant and its roles."""
    return {"principalId": ctx.principal.id, "name": ctx.principal.name,
            "tenantId": ctx.tenant.id, "tenant": ctx.tenant.slug,
            "homeTenantId": ctx.principal.tenant_id,
            "roles": selectors.principal_roles(ctx.principal)}


class TenantCreateIn(Input):
    slug = serializers.SlugField(max_length=63)
    name = serializers.CharField(max_length=200, required=False, default="")
    idempotency_key = IdempotencyKeyField()


def _root_draft(ctx: CallContext, data: dict[str, Any]) -> Resource:
    return Resource(kind="tenant", tenant_id=selectors.root_tenant().id)


@endpoint("tenants", "create", input=TenantCreateIn, mutating=True, draft=_root_draft)
def tenants_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Create a customer tenant (root administrators only)."""
    return present_tenant(services.tenant_create(actor=ctx.principal, **data))


class TenantGetIn(Input):
    pass


def _acting_tenant_draft(ctx: CallContext, data: dict[str, Any]) -> Resource:
    return Resource(kind="tenant", tenant_id=ctx.tenant.id, id=ctx.tenant.id)


@endpoint("tenants", "get", input=TenantGetIn, mutating=False, draft=_acting_tenant_draft)
def tenants_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The tenant the call acts in (`tenantId`, by default the caller's own)."""
    return present_tenant(ctx.tenant)


@endpoint("tenants", "list", input=ListInput, mutating=False)
def tenants_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Tenants visible from the acting tenant (root sees all)."""
    return page(selectors.tenant_list(tenant=ctx.tenant), present=present_tenant, **data)


class TokenCreateIn(Input):
    name = serializers.CharField(max_length=200)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)
    ttl = serializers.IntegerField(required=False, min_value=60_000,
                                   help_text="Lifetime in milliseconds; no expiry if absent.")
    principal_id = PublicIdField("prn", required=False,
                                 help_text="Add a token to this principal instead of a new one.")


@endpoint("tokens", "create", input=TokenCreateIn, mutating=True)
def tokens_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Mint an API token. The `token` field is shown once and never again."""
    ttl = data.pop("ttl", None)
    minted = services.token_create(
        tenant=ctx.tenant, actor=ctx.principal,
        ttl=timedelta(milliseconds=ttl) if ttl else None, **data)
    return {**present_token(minted.token), "token": minted.plaintext}


def _token_guard(ctx: CallContext, token_id: str) -> ApiToken:
    return selectors.access_token_by_id(tenant=ctx.tenant, token_id=token_id)


@endpoint("tokens", "list", input=ListInput, mutating=False)
def tokens_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """API tokens of the tenant's principals (never their secrets)."""
    return page(selectors.token_list(tenant=ctx.tenant), present=present_token, **data)


class TokenRevokeIn(Input):
    token_id = PublicIdField("tok")


@endpoint("tokens", "revoke", input=TokenRevokeIn, mutating=True,
          draft=object_draft("token", _token_guard, "token_id"))
def tokens_revoke(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Revoke an API token."""
    return present_token(services.token_revoke(tenant=ctx.tenant, actor=ctx.principal,
                                               token_id=data["token_id"]))
