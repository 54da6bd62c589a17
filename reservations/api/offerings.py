"""API methods pools.offer (a pool offered to a tenant with quotas and limits) and
offerings.list."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, ListInput
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from compute.platform.tenancy.selectors import tenant_by_ref
from fleet.api.pools import PoolIdIn, pool_subject
from fleet.presenters import CLASS_NAME
from reservations.budgets import PERIODS
from reservations.events import ReservationEvent
from reservations.presenters import OFFERING, present_offering
from reservations.selectors import offering_list
from reservations.services.offerings import pool_offer


@endpoint("offerings", "list", returns=page_of(OFFERING), input=ListInput, mutating=False)
def offerings_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Offerings the tenant made or received, with quota use."""
    return page(offering_list(tenant=ctx.tenant), present=present_offering, **data)


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


class BudgetIn(Input):
    gpu_hours = serializers.FloatField(min_value=0.01, max_value=10**9,
                                       help_text="GPU-hours booked in one period, at most.")
    period = serializers.ChoiceField(choices=PERIODS, help_text=(
        "day, week (from Monday) or month, in the pool's time zone (policy timeZone)."))
    priority_class = serializers.RegexField(CLASS_NAME, max_length=32, required=False,
                                            help_text="Only this class's bookings (absent: "
                                                      "all of the tenant's).")


class LimitsIn(Input):
    """Limits against hoarding; each absent one is no limit."""

    max_duration_hours = serializers.FloatField(required=False, min_value=0.01,
                                                max_value=366 * 24)
    max_start_ahead_days = serializers.FloatField(required=False, min_value=0, max_value=366)
    max_gpus_at_once = serializers.IntegerField(required=False, min_value=1, max_value=10**6)
    idle_reclaim = IdleReclaimIn(
        required=False, help_text="Flag (and optionally release) reservations whose GPUs "
                                  "report low utilization for a while.")
    budgets = BudgetIn(many=True, required=False, max_length=16, help_text=(  # type: ignore[call-arg]
        "GPU-hour budgets per period: what the tenant books (future bookings count) in a "
        "period may not pass them."))


class PoolOfferIn(PoolIdIn):
    to = serializers.CharField(max_length=63, help_text="Tenant id or slug.")
    quota = serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=10**9),
                                  allow_empty=False, help_text="Such as {\"gpu\": 16}.")
    limits = LimitsIn(required=False, help_text="Replaces the offering's limits when given.")
    share = serializers.IntegerField(required=False, min_value=1, max_value=10_000,
                                     help_text="The tenant's fair-share weight on the pool "
                                               "(1 when the offering is made).")
    priority_classes = serializers.ListField(
        child=serializers.RegexField(CLASS_NAME, max_length=32), required=False,
        min_length=1, max_length=32,
        help_text="The priority classes the tenant may ask for (normal and preemptible when "
                  "the offering is made).")


@endpoint("pools", "offer", returns=OFFERING, input=PoolOfferIn, mutating=True,
          subject=pool_subject(owned=True),
          emits=(ReservationEvent.POOL_OFFERED, ReservationEvent.OFFERING_UPDATED))
def pools_offer(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Offer a pool to a tenant with quotas (gpu for GPU pools; vcpu, memory for CPU pools)."""
    offering = pool_offer(tenant=ctx.tenant, actor=ctx.principal, pool_id=ctx.subject.id,
                          to=tenant_by_ref(data["to"]), quota=data["quota"],
                          limits=LimitsIn.wire_form(data["limits"]) if "limits" in data
                          else None, share=data.get("share"),
                          priority_classes=data.get("priority_classes"))
    return present_offering(offering_list(tenant=ctx.tenant).get(pk=offering.pk))
