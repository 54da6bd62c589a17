"""API method usage.list."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import ListInput
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from reservations import selectors
from reservations.presenters import USAGE, present_usage


class UsageListIn(ListInput):
    meter = serializers.CharField(required=False, max_length=64)
    subject = serializers.CharField(required=False, max_length=40,
                                    help_text="Only this reservation's or sandbox's records.")


@endpoint("usage", "list", returns=page_of(USAGE), input=UsageListIn, mutating=False)
def usage_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Metered usage of the tenant, such as gpu.H100.hours, per ended window."""
    queryset = selectors.usage_list(tenant=ctx.tenant, meter=data.pop("meter", None),
                                    subject=data.pop("subject", None))
    return page(queryset, present=present_usage, **data)
