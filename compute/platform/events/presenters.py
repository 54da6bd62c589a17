from __future__ import annotations

from typing import Any

from compute.core.api.shapes import INTEGER, OBJECT, STRING, TIME, obj
from compute.platform.events.models import Event

EVENT = obj(seq=INTEGER, id=STRING, type=STRING, tenantId=STRING, subject=STRING,
            payload=OBJECT, createdAt=TIME)


def present_event(event: Event) -> dict[str, Any]:
    return {"seq": event.position, "id": event.id, "type": event.type, "tenantId": event.tenant_id,
            "subject": event.subject, "payload": event.payload, "createdAt": event.created_at}
