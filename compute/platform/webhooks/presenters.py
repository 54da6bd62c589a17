"""What webhooks.* answer."""

from __future__ import annotations

from typing import Any

from compute.core.api.shapes import INTEGER, STRING, TIME, array, nullable, obj
from compute.platform.webhooks.models import Delivery, Subscription

WEBHOOK = obj(id=STRING, url=STRING, types=array(STRING), description=STRING,
              maxAttempts=INTEGER, createdAt=TIME)
DELIVERY = obj(id=STRING, webhookId=STRING, eventId=STRING, eventType=STRING, seq=INTEGER,
               state=STRING, attempts=INTEGER, nextAttemptAt=nullable(TIME),
               lastStatus=nullable(INTEGER), lastError=STRING, createdAt=TIME,
               deliveredAt=nullable(TIME))


def present_webhook(subscription: Subscription) -> dict[str, Any]:
    return {"id": subscription.id, "url": subscription.url, "types": subscription.types,
            "description": subscription.description, "maxAttempts": subscription.max_attempts,
            "createdAt": subscription.created_at}


def present_delivery(delivery: Delivery) -> dict[str, Any]:
    pending = delivery.state == "pending"
    return {"id": delivery.id, "webhookId": delivery.subscription_id,
            "eventId": delivery.event.id, "eventType": delivery.event.type,
            "seq": delivery.position, "state": delivery.state, "attempts": delivery.attempts,
            "nextAttemptAt": delivery.next_attempt_at if pending else None,
            "lastStatus": delivery.last_status, "lastError": delivery.last_error,
            "createdAt": delivery.created_at, "deliveredAt": delivery.delivered_at}
