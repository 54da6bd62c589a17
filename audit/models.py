"""The audit trail: one append-only row for every mutating call, allowed or denied."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from bcd.contract import ids


def _new_audit_id() -> str:
    return ids.new("aud")


class AuditEvent(models.Model):
    """What an actor did (or was refused) in a tenant. Rows are never updated or deleted.

    `tenant_id` is a plain column, not a foreign key: the trail outlives what it describes.
    """

    seq = models.BigAutoField(primary_key=True)
    id = models.CharField(max_length=32, unique=True, default=_new_audit_id, editable=False)
    tenant_id = models.CharField(max_length=32, db_index=True)
    actor_id = models.CharField(max_length=32, blank=True)
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=64, blank=True)
    allowed = models.BooleanField(default=True)
    reason = models.CharField(max_length=300, blank=True)
    decision_id = models.CharField(max_length=32, blank=True)
    request_id = models.CharField(max_length=32, blank=True)
    origin = models.CharField(max_length=16, default="api")
    data = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["tenant_id", "seq"], name="audit_event_tenant_seq")]

    def __str__(self) -> str:
        return f"{self.action} {self.target} by {self.actor_id}"
