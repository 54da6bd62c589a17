"""Subscribing, replaying and deleting webhooks, and delivering them.

A subscription is a durable reader of its tenant's event stream (by position, as `events
watch` reads it, so it never passes an event that commits late). The worker's pass for a
subscription first gives each new event of its types a Delivery row, then sends the oldest
pending one, and the next only once that one was delivered or dead-lettered: each
subscription's events arrive in order. A failed attempt is tried again after 1, 2, 4 … s
(at most an hour); after `max_attempts` the delivery is dead, kept for a replay, and the
next one goes on.
"""

from __future__ import annotations

import json

from django.core.serializers.json import DjangoJSONEncoder

from audit.sealing import SealedSecret, seal, unseal
from audit.services import audit_exempt, audit_record, audited
from compute.core.db import database_now
from compute.core.errors import InvalidArgument, PermissionDenied
from compute.core.metrics import WEBHOOK_ATTEMPTS
from compute.platform.events.models import Event
from compute.platform.events.presenters import present_event
from compute.platform.events.selectors import event_head, type_filter
from compute.platform.events.services import event_emit
from compute.platform.queue.work import enqueue
from compute.platform.tenancy.models import Principal, Tenant
from compute.platform.webhooks.events import WebhookEvent
from compute.platform.webhooks.models import Delivery, DeliveryState, Subscription
from compute.platform.webhooks.outbound import (
    Outcome,
    Refused,
    check_url,
    new_secret,
    retry_wait,
    send,
)

WEBHOOK = "webhook"  # the work item of one subscription (its key: the subscription's id)
SCAN_BATCH = 500
SEND_BATCH = 100


def secret_name(subscription_id: str) -> str:
    return f"webhook:{subscription_id}"


@audited
def webhook_create(*, tenant: Tenant, actor: Principal, url: str, types: str,
                   description: str = "", max_attempts: int = 8) -> tuple[Subscription, str]:
    """Subscribe `url` to the tenant's events of `types` from now on; returns the
    subscription and its secret (shown this once; sealed at rest)."""
    try:
        check_url(url)
    except Refused as refused:
        raise PermissionDenied(f"url: {refused}", field="url") from None
    type_filter(types)  # a glob that names no type is refused here
    globs = [glob.strip() for glob in types.split(",") if glob.strip()] or ["*"]
    subscription = Subscription.objects.create(
        tenant=tenant, url=url, types=globs, description=description,
        max_attempts=max_attempts, scanned=event_head(tenant=tenant), created_by=actor.id)
    secret = new_secret()
    seal(secret_name(subscription.id), secret.encode())
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="webhook.create",
                 target=subscription.id, data={"url": url, "types": globs})
    event_emit(tenant_id=tenant.id, type=WebhookEvent.WEBHOOK_CREATED, subject=subscription.id,
               payload={"url": url, "types": globs})
    return subscription, secret


@audited
def webhook_delete(*, tenant: Tenant, actor: Principal, subscription: Subscription) -> None:
    """Stop delivering; the subscription, its log and its secret are gone."""
    subscription_id = subscription.id
    SealedSecret.objects.filter(pk=secret_name(subscription_id)).delete()
    Subscription.objects.filter(pk=subscription_id).delete()
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="webhook.delete",
                 target=subscription_id, data={"url": subscription.url})
    event_emit(tenant_id=tenant.id, type=WebhookEvent.WEBHOOK_DELETED, subject=subscription_id,
               payload={"url": subscription.url})


@audited
def webhook_replay(*, tenant: Tenant, actor: Principal, subscription: Subscription,
                   delivery_id: str | None = None, since: int | None = None) -> int:
    """Send again one delivery, or every delivery after position `since`, whatever their
    state, before anything newer (in position order); returns how many."""
    deliveries = Delivery.objects.filter(subscription=subscription)
    if delivery_id is not None:
        deliveries = deliveries.filter(pk=delivery_id)
        if not deliveries.exists():
            raise InvalidArgument(f"deliveryId: {subscription.id} has no delivery "
                                  f"{delivery_id}", field="deliveryId")
    elif since is not None:
        deliveries = deliveries.filter(position__gt=since)
    else:
        raise InvalidArgument("give deliveryId or since", field="deliveryId")
    count = deliveries.update(state=DeliveryState.PENDING, attempts=0,
                              next_attempt_at=database_now(), last_error="")
    enqueue(WEBHOOK, subscription.id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="webhook.replay",
                 target=subscription.id, data={"deliveryId": delivery_id, "since": since,
                                               "count": count})
    event_emit(tenant_id=tenant.id, type=WebhookEvent.WEBHOOK_REPLAYED, subject=subscription.id,
               payload={"count": count})
    return count


@audited
def webhook_collect(subscription_id: str) -> bool:
    """Give each event of the subscription's types after what it scanned a Delivery row;
    whether any is pending."""
    subscription = (Subscription.objects.select_for_update(no_key=True)
                    .filter(pk=subscription_id).first())
    if subscription is None:
        audit_exempt("the subscription is gone")
        return False
    head = event_head(tenant=subscription.tenant)
    events = list(Event.objects.filter(tenant_id=subscription.tenant_id,
                                       position__gt=subscription.scanned, position__lte=head)
                  .filter(type_filter(",".join(subscription.types)))
                  .order_by("position").values_list("seq", "position")[:SCAN_BATCH])
    now = database_now()  # the clock every attempt is timed by
    Delivery.objects.bulk_create([Delivery(subscription=subscription, event_id=seq,
                                           position=int(position or 0), next_attempt_at=now,
                                           created_at=now)
                                  for seq, position in events], ignore_conflicts=True)
    subscription.scanned = int(events[-1][1] or 0) if len(events) == SCAN_BATCH else head
    Subscription.objects.filter(pk=subscription.pk).update(scanned=subscription.scanned)
    audit_exempt("deliveries of events the stream holds: bookkeeping nobody decided")
    if len(events) == SCAN_BATCH:
        enqueue(WEBHOOK, subscription.id)  # more to read
    return Delivery.objects.filter(subscription=subscription,
                                   state=DeliveryState.PENDING).exists()


@audited
def webhook_attempt_record(delivery_id: str, outcome: Outcome) -> Delivery | None:
    """Record one attempt: delivered, to be tried again later, or dead after its last."""
    delivery = (Delivery.objects.select_for_update().select_related("subscription")
                .filter(pk=delivery_id, state=DeliveryState.PENDING).first())
    if delivery is None:  # deleted, or replayed meanwhile
        audit_exempt("the delivery is gone or no longer pending")
        return None
    now = database_now()
    delivery.attempts += 1
    delivery.last_status, delivery.last_error = outcome.status, outcome.error[:300]
    subscription = delivery.subscription
    if outcome.ok:
        delivery.state, delivery.delivered_at = DeliveryState.DELIVERED, now
        audit_exempt("a delivery, recorded in its log")
    elif delivery.attempts >= subscription.max_attempts:
        delivery.state = DeliveryState.DEAD
        audit_record(tenant_id=subscription.tenant_id, actor_id="system",
                     action="webhook.delivery.dead", target=subscription.id,
                     data={"deliveryId": delivery.id, "position": delivery.position,
                           "attempts": delivery.attempts, "lastError": delivery.last_error})
        event_emit(tenant_id=subscription.tenant_id, type=WebhookEvent.WEBHOOK_DELIVERY_DEAD,
                   subject=subscription.id,
                   payload={"deliveryId": delivery.id, "attempts": delivery.attempts})
    else:
        delivery.next_attempt_at = now + retry_wait(delivery.attempts)
        audit_exempt("a failed attempt, recorded in its delivery's log")
    delivery.save(update_fields=["attempts", "last_status", "last_error", "state",
                                 "delivered_at", "next_attempt_at"])
    return delivery


def webhook_pass(subscription_id: str) -> None:
    """The worker's pass for one subscription: collect, then send in order until one fails
    or is not due yet (then the item is queued again for when it is)."""
    if not webhook_collect(subscription_id):
        return
    secret: str | None = None
    for _ in range(SEND_BATCH):
        head = (Delivery.objects.select_related("subscription", "event")
                .filter(subscription_id=subscription_id, state=DeliveryState.PENDING)
                .order_by("position").first())
        if head is None:
            return
        if head.next_attempt_at > database_now():
            enqueue(WEBHOOK, subscription_id, due_at=head.next_attempt_at)
            return
        if secret is None:
            row = SealedSecret.objects.get(pk=secret_name(subscription_id))
            secret = unseal(row).decode()
        body = json.dumps(message(head.event), cls=DjangoJSONEncoder,
                          separators=(",", ":")).encode()
        recorded = webhook_attempt_record(head.id,
                                          send(head.subscription.url, secret, head.event.id, body))
        if recorded is not None:
            WEBHOOK_ATTEMPTS.labels(outcome="failed" if recorded.state == DeliveryState.PENDING
                                    else recorded.state).inc()
        if recorded is not None and recorded.state == DeliveryState.PENDING:
            enqueue(WEBHOOK, subscription_id, due_at=recorded.next_attempt_at)
            return
    enqueue(WEBHOOK, subscription_id)  # more than a batch: the rest in the next pass


def message(event: Event) -> dict[str, object]:
    """The body, as Standard Webhooks shapes it: type, timestamp and the event as data."""
    return {"type": event.type, "timestamp": event.created_at, "data": present_event(event)}
