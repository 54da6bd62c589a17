"""API methods pools.*."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from compute.platform.tenancy.selectors import tenant_by_ref
from fleet.events import FleetEvent
from fleet.models import PoolClass
from fleet.presenters import POOL, PolicyIn, present_pool
from fleet.selectors import access_pool_by_id, pool_list
from fleet.services.pools import pool_create
from reservations.events import ReservationEvent
from reservations.presenters import OFFERING, present_offering
from reservations.selectors import offering_list
from reservations.services.offerings import pool_offer


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


class IdleReclaimIn(Input):
    below_percent = serializers.FloatField(min_value=0.1, max_value=100,
                                           help_text="GPU utilization under this is idle.")
    for_minutes = serializers.FloatField(min_value=0.1, max_value=1440,
                                         help_text="Idle this long (every GPU held) is "
                                                   "flagged with reservation.idle.")
    release = serializers.BooleanField(required=False, default=False,
                                       help_text="Release a flagged reservation that stays "
                                                 "idle for graceMinutes.")
    grace_minutes = serializers.FloatField(required=False, default=10, min_value=0,
                                           max_value=1440)


class LimitsIn(Input):
    """Limits against hoarding; each absent one is no limit."""

    max_duration_hours = serializers.FloatField(required=False, min_value=0.01,
                                                max_value=366 * 24)
    max_start_ahead_days = serializers.FloatField(required=False, min_value=0, max_value=366)
    max_gpus_at_once = serializers.IntegerField(required=False, min_value=1, max_value=10**6)
    idle_reclaim = IdleReclaimIn(
        required=False, help_text="Flag (and optionally release) reservations whose GPUs "
                                  "report low utilization for a while.")


class PoolOfferIn(PoolIdIn):
    to = serializers.CharField(max_length=63, help_text="Tenant id or slug.")
    quota = serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=10**9),
                                  allow_empty=False, help_text="Such as {\"gpu\": 16}.")
    limits = LimitsIn(required=False, help_text="Replaces the offering's limits when given.")


@endpoint("pools", "offer", returns=OFFERING, input=PoolOfferIn, mutating=True,
          subject=pool_subject(owned=True),
          emits=(ReservationEvent.POOL_OFFERED, ReservationEvent.OFFERING_UPDATED))
def pools_offer(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Offer a pool to a tenant with quotas (gpu for GPU pools; vcpu, memory for CPU pools)."""
    offering = pool_offer(tenant=ctx.tenant, actor=ctx.principal, pool_id=ctx.subject.id,
                          to=tenant_by_ref(data["to"]), quota=data["quota"],
                          limits=LimitsIn.wire_form(data["limits"]) if "limits" in data
                          else None)
    return present_offering(offering_list(tenant=ctx.tenant).get(pk=offering.pk))
