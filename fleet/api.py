"""API methods: sites.*, pools.create/get/list."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.api.drafts import object_draft
from compute.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.api.registry import CallContext, endpoint
from compute.paging import page
from fleet import selectors
from fleet.models import Pool, PoolClass, Site
from fleet.serializers import PolicyIn, present_pool, present_site
from fleet.services.pools import pool_create
from fleet.services.sites import site_create


class SiteCreateIn(Input):
    kind = serializers.ChoiceField(choices=Site.Kind.choices)
    region = serializers.RegexField(r"^[a-z0-9][a-z0-9-]{0,62}$", max_length=63)
    name = serializers.CharField(max_length=200, required=False, default="")
    idempotency_key = IdempotencyKeyField()


@endpoint("sites", "create", input=SiteCreateIn, mutating=True)
def sites_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Create a platform site (root tenant only)."""
    return present_site(site_create(tenant=ctx.tenant, actor=ctx.principal, **data))


def _site_guard(ctx: CallContext, site_id: str) -> Site:
    return selectors.access_site_by_id(tenant=ctx.tenant, site_id=site_id)


class SiteGetIn(Input):
    site_id = PublicIdField("site")


@endpoint("sites", "get", input=SiteGetIn, mutating=False,
          draft=object_draft("site", _site_guard, "site_id"))
def sites_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One site."""
    return present_site(_site_guard(ctx, data["site_id"]))


@endpoint("sites", "list", input=ListInput, mutating=False)
def sites_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sites of the tenant."""
    return page(selectors.site_list(tenant=ctx.tenant), present=present_site, **data)


class PoolCreateIn(Input):
    site_id = PublicIdField("site")
    pool_class = serializers.ChoiceField(choices=PoolClass.choices)
    gpu_model = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$", required=False,
                                       default="", max_length=63)
    policy = PolicyIn(required=False)
    name = serializers.CharField(max_length=200, required=False, default="")
    idempotency_key = IdempotencyKeyField()
    aliases = {"class": "pool_class"}


@endpoint("pools", "create", input=PoolCreateIn, mutating=True)
def pools_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Create a pool of one GPU model (or CPU only) with an acceptance policy."""
    raw_policy = data.pop("policy", None)
    policy = PolicyIn.wire_form(raw_policy) if raw_policy else {}
    return present_pool(pool_create(tenant=ctx.tenant, actor=ctx.principal, policy=policy,
                                    **data))


def _pool_guard(ctx: CallContext, pool_id: str) -> Pool:
    return selectors.access_pool_by_id(tenant=ctx.tenant, pool_id=pool_id)


class PoolGetIn(Input):
    pool_id = PublicIdField("pool")


@endpoint("pools", "get", input=PoolGetIn, mutating=False,
          draft=object_draft("pool", _pool_guard, "pool_id"))
def pools_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One pool (owned or offered to the tenant)."""
    return present_pool(_pool_guard(ctx, data["pool_id"]))


@endpoint("pools", "list", input=ListInput, mutating=False)
def pools_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Pools the tenant owns or was offered."""
    return page(selectors.pool_list(tenant=ctx.tenant), present=present_pool, **data)
