"""Webhooks' event types."""

from __future__ import annotations

from compute.platform.events.types import EventType, event_types


@event_types
class WebhookEvent(EventType):
    WEBHOOK_CREATED = "webhook.created"
    WEBHOOK_DELETED = "webhook.deleted"
    WEBHOOK_REPLAYED = "webhook.replayed"
    WEBHOOK_DELIVERY_DEAD = "webhook.delivery.dead"
