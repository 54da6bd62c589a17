"""Reads of the audit trail, always of one tenant."""

from __future__ import annotations

from audit.models import AuditEvent, Checkpoint
from audit.sequencer import audit_sequence
from compute.core.errors import NotFound


def audit_event_list(*, tenant_id: str, action: str | None = None,
                     allowed: bool | None = None, target: str | None = None,
                     since: int = 0, before: int | None = None,
                     limit: int | None = None) -> list[AuditEvent]:
    """The tenant's audit rows after position `since`, oldest first: the first `limit` of
    them, or with `before`, the last `limit` before that position. `action` may end in
    `*` (`node.*`). Rows whose transactions have settled are numbered first; a row still
    in flight is listed once it has its position."""
    audit_sequence(tenant_id=tenant_id)
    rows = AuditEvent.objects.filter(tenant_id=tenant_id, position__gt=since)
    if action:
        rows = (rows.filter(action__startswith=action[:-1]) if action.endswith("*")
                else rows.filter(action=action))
    if allowed is not None:
        rows = rows.filter(allowed=allowed)
    if target:
        rows = rows.filter(target=target)
    if before is not None:
        newest = rows.filter(position__lt=before).order_by("-position")
        return list(reversed(newest[:limit] if limit else newest))
    ordered = rows.order_by("position")
    return list(ordered[:limit] if limit else ordered)


def audit_event_id_for(*, tenant_id: str, ref: str) -> str:
    """The audit row a reference names: its own id (`aud_…`), or the latest row about an
    object (a reservation, a node, a join token…)."""
    if ref.startswith("aud_"):
        return ref
    audit_sequence(tenant_id=tenant_id)
    found = (AuditEvent.objects.filter(tenant_id=tenant_id, target=ref)
             .order_by("-position").values_list("id", flat=True).first())
    if found is None:
        raise NotFound(f"no audit event is about {ref}", eventId=ref)
    return found


def checkpoint_list(*, tenant_id: str, limit: int) -> list[Checkpoint]:
    """The tenant's newest signed checkpoints, newest first."""
    return list(Checkpoint.objects.filter(tenant_id=tenant_id).order_by("-tree_size")[:limit])
