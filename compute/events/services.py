"""The one outbox writer."""

from __future__ import annotations

from typing import Any

from django.db import connection

from compute.db import CURRENT_TXID
from compute.events.models import Event
from compute.events.types import EventType


def event_emit(*, tenant_id: str, type: EventType, subject: str,
               payload: dict[str, Any] | None = None) -> Event:
    """Write one event row in the caller's transaction; it is visible once that commits.

    A NOTIFY in the same transaction wakes the tenant's watchers at commit (and never for a
    rolled-back change).
    """
    event = Event.objects.create(tenant_id=tenant_id, type=EventType(type), subject=subject,
                                 payload=payload or {}, txid=CURRENT_TXID)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify('bc_events', %s)", [tenant_id])
    return event
