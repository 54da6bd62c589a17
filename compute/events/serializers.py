from __future__ import annotations

from typing import Any

from compute.events.models import Event


def present_event(event: Event) -> dict[str, Any]:
    return {"seq": event.seq, "id": event.id, "type": event.type, "tenantId": event.tenant_id,
            "subject": event.subject, "payload": event.payload, "createdAt": event.created_at}
