"""Reads of webhooks: a tenant sees its own subscriptions and their deliveries only."""

from __future__ import annotations

from django.db.models import QuerySet

from compute.platform.guards import one_visible
from compute.platform.tenancy.models import Tenant
from compute.platform.webhooks.models import Delivery, Subscription


def subscription_list(*, tenant: Tenant) -> QuerySet[Subscription]:
    return Subscription.objects.filter(tenant=tenant)


def access_subscription_by_id(*, tenant: Tenant, webhook_id: str) -> Subscription:
    return one_visible(subscription_list(tenant=tenant), webhook_id, noun="webhook",
                       field="webhookId")


def delivery_list(*, subscription: Subscription, state: str | None = None
                  ) -> QuerySet[Delivery]:
    """The subscription's delivery log, newest first."""
    deliveries = Delivery.objects.filter(subscription=subscription).select_related("event")
    if state:
        deliveries = deliveries.filter(state=state)
    return deliveries.order_by("-position")
