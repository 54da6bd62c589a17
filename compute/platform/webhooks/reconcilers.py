"""The worker's side of webhooks: a subscription's pass (compute.platform.webhooks.services),
queued when its tenant's stream has grown past what it scanned or a retry falls due."""

from __future__ import annotations

from django.db.models import F, OuterRef, Subquery

from compute.core.db import database_now
from compute.platform.events.models import EventHead
from compute.platform.events.sequencer import event_sequence
from compute.platform.queue.work import enqueue, handler
from compute.platform.webhooks.models import Delivery, DeliveryState, Subscription
from compute.platform.webhooks.services import WEBHOOK, webhook_pass


@handler(WEBHOOK)
def reconcile_webhook(subscription_id: str) -> None:
    webhook_pass(subscription_id)


def sweep(limit: int = 500) -> int:
    """Queue the subscriptions with events to read or a retry due; cheap when none."""
    tenants = set(Subscription.objects.values_list("tenant_id", flat=True).distinct())
    for tenant_id in tenants:
        event_sequence(tenant_id=tenant_id)  # positions for what committed since
    head = EventHead.objects.filter(tenant_id=OuterRef("tenant_id")).values("size")[:1]
    behind = Subscription.objects.annotate(head=Subquery(head)).filter(scanned__lt=F("head"))
    due = (Delivery.objects.filter(state=DeliveryState.PENDING,
                                   next_attempt_at__lte=database_now())
           .values_list("subscription_id", flat=True).distinct())
    queued = set(behind.values_list("id", flat=True)[:limit]) | set(due[:limit])
    for subscription_id in sorted(queued):
        enqueue(WEBHOOK, subscription_id)
    return len(queued)
