"""API methods of fleet trust: joinTokens.*, pki.show, nodes.adopt."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework import serializers

from compute.api.drafts import object_draft
from compute.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.api.registry import CallContext, endpoint
from compute.paging import page
from fleet import selectors
from fleet.models import JoinToken, Node, Pool
from fleet.pki import pki
from fleet.serializers import present_join_token, present_node
from fleet.services.join_tokens import join_token_create, join_token_revoke
from fleet.services.lifecycle import node_adopt_again


class JoinTokenCreateIn(Input):
    pool_id = PublicIdField("pool")
    ttl = serializers.IntegerField(min_value=60_000, max_value=86_400_000,
                                   help_text="Milliseconds, 1m to 24h.")
    max_uses = serializers.IntegerField(min_value=1, max_value=10_000, default=1)
    expect_serial = serializers.CharField(required=False, default="", max_length=128)
    expect_product_uuid = serializers.CharField(required=False, default="", max_length=64)
    expect_mac = serializers.RegexField(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$",
                                        required=False, default="")
    idempotency_key = IdempotencyKeyField()


def _owned_pool_guard(ctx: CallContext, pool_id: str) -> Pool:
    return selectors.access_pool_by_id(tenant=ctx.tenant, pool_id=pool_id, owned=True)


@endpoint("joinTokens", "create", input=JoinTokenCreateIn, mutating=True,
          draft=object_draft("pool", _owned_pool_guard, "pool_id"))
def join_tokens_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Mint a join token `bcjt_<id>.<secret>`, shown once (bind it with expect*)."""
    data["ttl"] = timedelta(milliseconds=data["ttl"])
    minted = join_token_create(tenant=ctx.tenant, actor=ctx.principal, **data)
    return {**present_join_token(minted.token), "token": minted.plaintext}


@endpoint("joinTokens", "list", input=ListInput, mutating=False)
def join_tokens_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Join tokens of the tenant's pools (never their secrets)."""
    return page(selectors.join_token_list(tenant=ctx.tenant), present=present_join_token,
                **data)


def _join_token_guard(ctx: CallContext, token_id: str) -> JoinToken:
    return selectors.access_join_token_by_id(tenant=ctx.tenant, token_id=token_id)


class JoinTokenRevokeIn(Input):
    join_token_id = PublicIdField("jtk")


@endpoint("joinTokens", "revoke", input=JoinTokenRevokeIn, mutating=True,
          draft=object_draft("join_token", _join_token_guard, "join_token_id"))
def join_tokens_revoke(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Revoke a join token: no machine can join with it from now on."""
    return present_join_token(join_token_revoke(tenant=ctx.tenant, actor=ctx.principal,
                                                token_id=data["join_token_id"]))


class PkiShowIn(Input):
    pass


@endpoint("pki", "show", input=PkiShowIn, mutating=False)
def pki_show(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The SPKI pins of the serving CA, the join-signing and the join-encryption keys."""
    authority = pki()
    return {"trustDomain": authority.trust_domain, **authority.pins()}


def _node_guard(ctx: CallContext, node_id: str) -> Node:
    return selectors.access_node_by_id(tenant=ctx.tenant, node_id=node_id)


class NodeAdoptIn(Input):
    node_id = PublicIdField("node")
    reason = serializers.CharField(max_length=300)


@endpoint("nodes", "adopt", input=NodeAdoptIn, mutating=True,
          draft=object_draft("node", _node_guard, "node_id"))
def nodes_adopt(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Start a new acceptance attempt for a node whose acceptance failed."""
    return present_node(node_adopt_again(tenant=ctx.tenant, actor=ctx.principal, **data))
