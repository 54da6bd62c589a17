"""The one outbox writer."""

from __future__ import annotations

from typing import Any

from compute.events.models import Event


def event_emit(*, tenant_id: str, type: str, subject: str,
               payload: dict[str, Any] | None = None) -> Event:
    """Write one event row in the caller's transaction; it is visible once that commits."""
    return Event.objects.create(tenant_id=tenant_id, type=type, subject=subject,
                                payload=payload or {})
