"""API methods sites.*."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from fleet import presenters as wire
from fleet.events import FleetEvent
from fleet.models import Site
from fleet.presenters import present_site
from fleet.selectors import access_site_by_id, site_list
from fleet.services.sites import site_create

SITE = Subject("site", access_site_by_id, "site_id")


class SiteCreateIn(Input):
    kind = serializers.ChoiceField(choices=Site.Kind.choices)
    region = serializers.RegexField(r"^[a-z0-9][a-z0-9-]{0,62}$", max_length=63)
    name = serializers.CharField(max_length=200, required=False, default="")
    idempotency_key = IdempotencyKeyField()


@endpoint("sites", "create", returns=wire.SITE, input=SiteCreateIn, mutating=True,
          emits=(FleetEvent.SITE_CREATED,))
def sites_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Create a platform site (root tenant only)."""
    return present_site(site_create(tenant=ctx.tenant, actor=ctx.principal, **data))


class SiteGetIn(Input):
    site_id = PublicIdField("site")


@endpoint("sites", "get", returns=wire.SITE, input=SiteGetIn, mutating=False, subject=SITE)
def sites_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One site."""
    return present_site(ctx.subject)


@endpoint("sites", "list", returns=page_of(wire.SITE), input=ListInput, mutating=False)
def sites_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sites of the tenant."""
    return page(site_list(tenant=ctx.tenant), present=present_site, **data)
