"""API methods: sites.*, pools.create/get/list."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.api.drafts import object_draft
from compute.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.api.registry import CallContext, endpoint
from compute.events.selectors import event_list
from compute.events.serializers import present_event
from compute.paging import page
from fleet import selectors
from fleet.models import Node, Pool, PoolClass, Site
from fleet.serializers import PolicyIn, present_device, present_node, present_pool, present_site
from fleet.services.nodes import node_cordon, node_uncordon
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


class NodeListIn(ListInput):
    pool_id = PublicIdField("pool", required=False)


@endpoint("nodes", "list", input=NodeListIn, mutating=False)
def nodes_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Nodes of the tenant's pools."""
    queryset = selectors.node_list(tenant=ctx.tenant, pool_id=data.pop("pool_id", None))
    return page(queryset, present=present_node, **data)


def _node_guard(ctx: CallContext, node_id: str) -> Node:
    return selectors.access_node_by_id(tenant=ctx.tenant, node_id=node_id)


class NodeIdIn(Input):
    node_id = PublicIdField("node")


@endpoint("nodes", "get", input=NodeIdIn, mutating=False,
          draft=object_draft("node", _node_guard, "node_id"))
def nodes_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One node with its conditions and devices."""
    node = _node_guard(ctx, data["node_id"])
    return {**present_node(node),
            "devices": [present_device(d) for d in node.devices.filter(present=True)]}


class NodeEventsIn(NodeIdIn):
    since = serializers.IntegerField(required=False, min_value=0, default=0)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=100)


@endpoint("nodes", "events", input=NodeEventsIn, mutating=False,
          draft=object_draft("node", _node_guard, "node_id"))
def nodes_events(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Events about one node, oldest first."""
    rows = event_list(tenant=ctx.tenant, subject=data["node_id"], since=data["since"],
                      limit=data["limit"])
    return {"items": [present_event(row) for row in rows]}


class NodeCordonIn(NodeIdIn):
    reason = serializers.CharField(required=False, default="", max_length=300, allow_blank=True)


@endpoint("nodes", "cordon", input=NodeCordonIn, mutating=True,
          draft=object_draft("node", _node_guard, "node_id"))
def nodes_cordon(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Stop placing on a node; what it holds stays."""
    return present_node(node_cordon(tenant=ctx.tenant, actor=ctx.principal, **data))


@endpoint("nodes", "uncordon", input=NodeCordonIn, mutating=True,
          draft=object_draft("node", _node_guard, "node_id"))
def nodes_uncordon(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Let the placer use a node again."""
    return present_node(node_uncordon(tenant=ctx.tenant, actor=ctx.principal, **data))


import fleet.api_trust  # noqa: E402, F401  (registers joinTokens.*, pki.show, nodes.adopt)
