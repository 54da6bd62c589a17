"""API methods pools.*."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from fleet.events import FleetEvent
from fleet.models import PoolClass
from fleet.presenters import POOL, PolicyIn, present_pool
from fleet.selectors import access_pool_by_id, pool_list
from fleet.services.pools import pool_create, pool_policy_update


def pool_subject(kind: str = "pool", *, owned: bool = False) -> Subject:
    """The pool a call names by `poolId` (owned, or also offered to the tenant)."""
    return Subject(kind, access_pool_by_id, "pool_id", options={"owned": owned})


class PoolCreateIn(Input):
    site_id = PublicIdField("site")
    pool_class = serializers.ChoiceField(choices=PoolClass.choices)
    gpu_model = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$", required=False,
                                       default="", max_length=63)
    policy = PolicyIn(required=False)
    name = serializers.CharField(max_length=200, required=False, default="")
    idempotency_key = IdempotencyKeyField()
    aliases = {"class": "pool_class"}
    rules = {"oneOf": [  # a GPU pool names its model; a CPU pool names none
        {"properties": {"class": {"enum": [PoolClass.METAL_HOST]},
                        "gpuModel": {"minLength": 1}}, "required": ["gpuModel"]},
        {"properties": {"class": {"enum": [PoolClass.CPU_HOST]},
                        "gpuModel": {"maxLength": 0}}}]}


@endpoint("pools", "create", returns=POOL, input=PoolCreateIn, mutating=True,
          emits=(FleetEvent.POOL_CREATED,))
def pools_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Create a pool of one GPU model (or CPU only) with an acceptance policy."""
    raw_policy = data.pop("policy", None)
    policy = PolicyIn.wire_form(raw_policy) if raw_policy else {}
    return present_pool(pool_create(tenant=ctx.tenant, actor=ctx.principal, policy=policy,
                                    **data))


class PoolIdIn(Input):
    pool_id = PublicIdField("pool")


@endpoint("pools", "get", returns=POOL, input=PoolIdIn, mutating=False, subject=pool_subject())
def pools_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One pool (owned or offered to the tenant)."""
    return present_pool(ctx.subject)


@endpoint("pools", "list", returns=page_of(POOL), input=ListInput, mutating=False)
def pools_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Pools the tenant owns or was offered."""
    return page(pool_list(tenant=ctx.tenant), present=present_pool, **data)


class PoolPolicyIn(Input):
    pool_id = PublicIdField("pool")
    policy = PolicyIn()


@endpoint("pools", "update", returns=POOL, input=PoolPolicyIn, mutating=True,
          emits=(FleetEvent.POOL_POLICY_UPDATED,))
def pools_update(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Replace a pool's policy; its nodes converge to the new profile of units."""
    return present_pool(pool_policy_update(tenant=ctx.tenant, actor=ctx.principal,
                                           pool_id=data["pool_id"],
                                           policy=PolicyIn.wire_form(data["policy"])))
