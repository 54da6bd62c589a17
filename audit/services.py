"""The one audit writer."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.utils import timezone

from audit.context import current_stamp
from audit.models import AuditEvent
from bcd.contract.auditproof import event_leaf


def _next_position(tenant_id: str) -> int:
    """Take the tenant's next position. The head row stays locked until commit, so
    positions follow commit order and a rolled-back writer leaves no gap."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO audit_audithead (tenant_id, size) VALUES (%s, 1) "
            "ON CONFLICT (tenant_id) DO UPDATE SET size = audit_audithead.size + 1 "
            "RETURNING size", [tenant_id])
        return int(cursor.fetchone()[0])


def audit_record(*, tenant_id: str, actor_id: str, action: str, target: str = "",
                 data: dict[str, Any] | None = None, allowed: bool = True,
                 reason: str = "") -> AuditEvent:
    """Append one audit row in the caller's transaction, stamped with the current request.

    Call it after the service's other locks: it takes the tenant's audit head lock.
    """
    stamp = current_stamp()
    event = AuditEvent(
        tenant_id=tenant_id, actor_id=actor_id, action=action, target=target,
        allowed=allowed, reason=reason or stamp.decision_reason,
        decision_id=stamp.decision_id, request_id=stamp.request_id, origin=stamp.origin,
        data=json.loads(json.dumps(data or {}, cls=DjangoJSONEncoder)),
        created_at=timezone.now(), position=_next_position(tenant_id))
    event.leaf_hash = event_leaf(event.wire()).hex()
    event.save(force_insert=True)
    return event
