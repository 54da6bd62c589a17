"""API methods joinTokens.*."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import STRING, extended, page_of
from compute.platform.paging import page
from fleet.events import FleetEvent
from fleet.presenters import JOIN_TOKEN, present_join_token
from fleet.selectors import access_join_token_by_id, access_pool_by_id, join_token_list
from fleet.services.join_tokens import join_token_create, join_token_revoke


class JoinTokenCreateIn(Input):
    pool_id = PublicIdField("pool")
    ttl = serializers.IntegerField(min_value=60_000, max_value=86_400_000,
                                   help_text="Milliseconds, 1m to 24h.")
    max_uses = serializers.IntegerField(min_value=1, max_value=10_000, default=1)
    expect_serial = serializers.CharField(required=False, default="", max_length=128)
    expect_product_uuid = serializers.CharField(required=False, default="", max_length=64)
    expect_mac = serializers.RegexField(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$",
                                        required=False, default="")
    role = serializers.ChoiceField(choices=["node", "provisioner"], default="node",
                                   help_text="provisioner: the machine runs `bcd node "
                                             "--provisioner` for its site's BMCs.")
    idempotency_key = IdempotencyKeyField()


@endpoint("joinTokens", "create", returns=extended(JOIN_TOKEN, token=STRING),
          input=JoinTokenCreateIn, mutating=True,
          subject=Subject("pool", access_pool_by_id, "pool_id", options={"owned": True}),
          emits=(FleetEvent.JOIN_TOKEN_CREATED,))
def join_tokens_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Mint a join token `bcjt_<id>.<secret>`, shown once (bind it with expect*)."""
    data["ttl"] = timedelta(milliseconds=data["ttl"])
    minted = join_token_create(tenant=ctx.tenant, actor=ctx.principal, **data)
    return {**present_join_token(minted.token), "token": minted.plaintext}


@endpoint("joinTokens", "list", returns=page_of(JOIN_TOKEN), input=ListInput, mutating=False)
def join_tokens_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Join tokens of the tenant's pools (never their secrets)."""
    return page(join_token_list(tenant=ctx.tenant), present=present_join_token, **data)


class JoinTokenRevokeIn(Input):
    join_token_id = PublicIdField("jtk")


@endpoint("joinTokens", "revoke", returns=JOIN_TOKEN, input=JoinTokenRevokeIn, mutating=True,
          subject=Subject("join_token", access_join_token_by_id, "join_token_id",
                          param="token_id"),
          emits=(FleetEvent.JOIN_TOKEN_REVOKED,))
def join_tokens_revoke(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Revoke a join token: no machine can join with it from now on."""
    return present_join_token(join_token_revoke(tenant=ctx.tenant, actor=ctx.principal,
                                                token_id=ctx.subject.id))
