"""API methods webhooks.*: subscribe a URL to the tenant's events, read the delivery log,
replay, delete."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import INTEGER, STRING, extended, obj, page_of
from compute.platform.events.types import type_globs_help, type_globs_pattern
from compute.platform.paging import page
from compute.platform.webhooks.events import WebhookEvent
from compute.platform.webhooks.models import DeliveryState
from compute.platform.webhooks.presenters import (
    DELIVERY,
    WEBHOOK,
    present_delivery,
    present_webhook,
)
from compute.platform.webhooks.selectors import (
    access_subscription_by_id,
    delivery_list,
    subscription_list,
)
from compute.platform.webhooks.services import webhook_create, webhook_delete, webhook_replay

URL_PATTERN = r"^https?://[^\s/?#@]+(?:[/?#]\S*)?$"
SUBSCRIPTION = Subject("webhook", access_subscription_by_id, "webhook_id")


class WebhookCreateIn(Input):
    url = serializers.RegexField(URL_PATTERN, max_length=2000, error_messages={
        "invalid": "must be an http:// or https:// URL with a host (and no user or password)"},
        help_text="Where to POST each event (the operator's BETTER_COMPUTE_WEBHOOK_ALLOW must "
                  "allow every address its host resolves to, else 403).")
    types = serializers.RegexField(type_globs_pattern(), max_length=500, default="*",
                                   error_messages={"invalid": type_globs_help()},
                                   help_text="Comma-separated event types or globs, such as "
                                             "'reservation.*,node.unreachable'.")
    description = serializers.CharField(max_length=200, required=False, default="")
    max_attempts = serializers.IntegerField(min_value=1, max_value=30, default=8, help_text=(
        "Attempts of one delivery (1, 2, 4 … s apart, at most an hour) before it is "
        "dead-lettered."))


@endpoint("webhooks", "create", returns=extended(WEBHOOK, secret=STRING),
          input=WebhookCreateIn, mutating=True, emits=(WebhookEvent.WEBHOOK_CREATED,))
def webhooks_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Subscribe a URL to the tenant's events from now on. The answer carries the signing
    secret, shown this once (deliveries are signed as Standard Webhooks says)."""
    subscription, secret = webhook_create(tenant=ctx.tenant, actor=ctx.principal, **data)
    return {**present_webhook(subscription), "secret": secret}


class WebhookIn(Input):
    webhook_id = PublicIdField("whk")


@endpoint("webhooks", "get", returns=WEBHOOK, input=WebhookIn, mutating=False,
          subject=SUBSCRIPTION)
def webhooks_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One subscription."""
    return present_webhook(ctx.subject)


@endpoint("webhooks", "list", returns=page_of(WEBHOOK), input=ListInput, mutating=False)
def webhooks_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The tenant's subscriptions."""
    return page(subscription_list(tenant=ctx.tenant), present=present_webhook, **data)


@endpoint("webhooks", "delete", returns=obj(deleted=STRING), input=WebhookIn, mutating=True,
          subject=SUBSCRIPTION, emits=(WebhookEvent.WEBHOOK_DELETED,))
def webhooks_delete(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Stop delivering; the subscription, its log and its secret are deleted."""
    webhook_delete(tenant=ctx.tenant, actor=ctx.principal, subscription=ctx.subject)
    return {"deleted": data["webhook_id"]}


class DeliveriesIn(ListInput):
    webhook_id = PublicIdField("whk")
    state = serializers.ChoiceField(choices=DeliveryState.choices, required=False)


@endpoint("webhooks", "deliveries", returns=page_of(DELIVERY), input=DeliveriesIn,
          mutating=False, subject=SUBSCRIPTION)
def webhooks_deliveries(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The subscription's delivery log, newest first: each event's state, attempts, and
    what the receiver last answered."""
    data.pop("webhook_id")
    deliveries = delivery_list(subscription=ctx.subject, state=data.pop("state", None))
    return page(deliveries, present=present_delivery, **data)


class ReplayIn(Input):
    webhook_id = PublicIdField("whk")
    delivery_id = PublicIdField("wdl", required=False,
                                help_text="Send this delivery again (dead or not).")
    since = serializers.IntegerField(required=False, min_value=0, help_text=(
        "Send again every delivery of an event after this position."))


@endpoint("webhooks", "replay", returns=obj(replayed=INTEGER), input=ReplayIn, mutating=True,
          subject=SUBSCRIPTION, emits=(WebhookEvent.WEBHOOK_REPLAYED,))
def webhooks_replay(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Send deliveries again, in order, before anything newer."""
    count = webhook_replay(tenant=ctx.tenant, actor=ctx.principal, subscription=ctx.subject,
                           delivery_id=data.get("delivery_id"), since=data.get("since"))
    return {"replayed": count}
