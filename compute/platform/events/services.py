"""The one outbox writer."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from compute.core.db import prepared_cursor
from compute.core.sqltext import tables
from compute.platform.events.models import Event
from compute.platform.events.types import EventType, known


def event_emit(*, tenant_id: str, type: EventType, subject: str,
               payload: dict[str, Any] | None = None) -> Event:
    """Write one event row in the caller's transaction; it is visible once that commits.

    A NOTIFY in the same transaction wakes the tenant's watchers at commit (and never for a
    rolled-back change).
    """
    event = Event(tenant_id=tenant_id, type=known(type), subject=subject,
                  payload=payload or {})
    with prepared_cursor() as cursor:
        cursor.execute(EMIT_SQL, [event.id, event.type, tenant_id, subject,
                                  json.dumps(event.payload, cls=DjangoJSONEncoder),
                                  event.created_at, tenant_id])
        event.seq = cursor.fetchone()[0]
    event._state.adding = False
    return event


# The row and the NOTIFY in one round trip.
EMIT_SQL = tables("""
WITH written AS (
  INSERT INTO {Event} (id, type, tenant_id, subject, payload, created_at)
  VALUES (%s, %s, %s, %s, %s::jsonb, %s)
  RETURNING seq)  -- the gateway's role may read no other column
SELECT seq, pg_notify('bc_events', %s) FROM written""", Event=Event)
