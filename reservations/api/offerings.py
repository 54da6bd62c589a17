"""API method offerings.list."""

from __future__ import annotations

from typing import Any

from compute.core.api.inputs import ListInput
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from reservations.presenters import OFFERING, present_offering
from reservations.selectors import offering_list


@endpoint("offerings", "list", returns=page_of(OFFERING), input=ListInput, mutating=False)
def offerings_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Offerings the tenant made or received, with quota use."""
    return page(offering_list(tenant=ctx.tenant), present=present_offering, **data)
