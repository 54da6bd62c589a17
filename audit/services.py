"""The one audit writer."""

from __future__ import annotations

from typing import Any

from audit.context import current_stamp
from audit.models import AuditEvent


def audit_record(*, tenant_id: str, actor_id: str, action: str, target: str = "",
                 data: dict[str, Any] | None = None, allowed: bool = True,
                 reason: str = "") -> AuditEvent:
    """Append one audit row in the caller's transaction, stamped with the current request."""
    stamp = current_stamp()
    return AuditEvent.objects.create(
        tenant_id=tenant_id, actor_id=actor_id, action=action, target=target,
        allowed=allowed, reason=reason or stamp.decision_reason,
        decision_id=stamp.decision_id, request_id=stamp.request_id, origin=stamp.origin,
        data=data or {})
