"""API methods of the ledger: pools.offer, offerings.list."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.api.drafts import object_draft
from compute.api.inputs import Input, ListInput, PublicIdField
from compute.api.registry import CallContext, endpoint
from compute.paging import page
from compute.tenancy.selectors import tenant_by_ref
from fleet.models import Pool
from fleet.selectors import access_pool_by_id
from reservations.selectors import offering_list
from reservations.serializers import present_offering
from reservations.services.offerings import pool_offer


class PoolOfferIn(Input):
    pool_id = PublicIdField("pool")
    to = serializers.CharField(max_length=63, help_text="Tenant id or slug.")
    quota = serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=10**9),
                                  allow_empty=False, help_text="Such as {\"gpu\": 16}.")


def _owned_pool_guard(ctx: CallContext, pool_id: str) -> Pool:
    return access_pool_by_id(tenant=ctx.tenant, pool_id=pool_id, owned=True)


@endpoint("pools", "offer", input=PoolOfferIn, mutating=True,
          draft=object_draft("pool", _owned_pool_guard, "pool_id"))
def pools_offer(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Offer a pool to a tenant with quotas (gpu for GPU pools; vcpu, memory for CPU pools)."""
    to = tenant_by_ref(data["to"])
    offering = pool_offer(tenant=ctx.tenant, actor=ctx.principal, pool_id=data["pool_id"], to=to,
                          quota=data["quota"])
    return present_offering(offering_list(tenant=ctx.tenant).get(pk=offering.pk))


@endpoint("offerings", "list", input=ListInput, mutating=False)
def offerings_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Offerings the tenant made or received, with quota use."""
    return page(offering_list(tenant=ctx.tenant), present=present_offering, **data)
