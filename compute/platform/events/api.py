"""API method events.list: the outbox, paged by sequence."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import INTEGER, items_of
from compute.platform.events.presenters import EVENT, present_event
from compute.platform.events.selectors import event_list
from compute.platform.events.types import type_globs_help, type_globs_pattern


class EventListIn(Input):
    types = serializers.RegexField(type_globs_pattern(), required=False, allow_blank=True,
                                   max_length=500, error_messages={"invalid": type_globs_help()},
                                   help_text="Comma-separated: `*`, event types, or groups "
                                             "such as 'node.*,pool.*'.")
    since = serializers.IntegerField(required=False, min_value=0, default=0,
                                     help_text="Return events after this sequence.")
    subject = serializers.CharField(required=False, max_length=32)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=100)


@endpoint("events", "list", returns=items_of(EVENT, nextSince=INTEGER),
          input=EventListIn, mutating=False)
def events_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Events of the tenant after `since`, oldest first."""
    rows = event_list(tenant=ctx.tenant, **data)
    items = [present_event(row) for row in rows]
    return {"items": items, "nextSince": items[-1]["seq"] if items else data["since"]}
