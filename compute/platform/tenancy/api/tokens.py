"""API methods tokens.*."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import STRING, extended, page_of
from compute.platform.paging import page
from compute.platform.tenancy.events import TenancyEvent
from compute.platform.tenancy.models import Role
from compute.platform.tenancy.presenters import TOKEN, present_token
from compute.platform.tenancy.selectors import access_token_by_id, token_list
from compute.platform.tenancy.services import token_create, token_revoke


class TokenCreateIn(Input):
    name = serializers.CharField(max_length=200)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)
    ttl = serializers.IntegerField(required=False, min_value=60_000,
                                   max_value=10 * 366 * 86_400_000,  # ten years
                                   help_text="Lifetime in milliseconds; no expiry if absent.")
    principal_id = PublicIdField("prn", required=False,
                                 help_text="Add a token to this principal instead of a new one.")


@endpoint("tokens", "create", returns=extended(TOKEN, token=STRING),
          input=TokenCreateIn, mutating=True,
          emits=(TenancyEvent.TOKEN_CREATED,))
def tokens_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Mint an API token. The `token` field is shown once and never again."""
    ttl = data.pop("ttl", None)
    minted = token_create(tenant=ctx.tenant, actor=ctx.principal,
                          ttl=timedelta(milliseconds=ttl) if ttl else None, **data)
    return {**present_token(minted.token), "token": minted.plaintext}


@endpoint("tokens", "list", returns=page_of(TOKEN), input=ListInput, mutating=False)
def tokens_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """API tokens of the tenant's principals (never their secrets)."""
    return page(token_list(tenant=ctx.tenant), present=present_token, **data)


class TokenRevokeIn(Input):
    token_id = PublicIdField("tok")


@endpoint("tokens", "revoke", returns=TOKEN, input=TokenRevokeIn, mutating=True,
          subject=Subject("token", access_token_by_id, "token_id"),
          emits=(TenancyEvent.TOKEN_REVOKED,))
def tokens_revoke(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Revoke an API token."""
    return present_token(token_revoke(tenant=ctx.tenant, actor=ctx.principal,
                                      token_id=ctx.subject.id))
