"""The audit trail: one append-only row for every mutating call, allowed or denied, and
the signed checkpoints over it."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from audit.sealing import SealedSecret
from bcd.contract import ids


def _new_audit_id() -> str:
    return ids.new("aud")


def _new_checkpoint_id() -> str:
    return ids.new("ckpt")


class AuditEvent(models.Model):
    """What an actor did (or was refused) in a tenant. Rows are never updated or deleted.

    `position` numbers a tenant's events 1, 2, 3… with no gaps; it is given once, after the
    writing transaction (`txid`) commits, in transaction order (audit.sequencer), and with
    it `leaf_hash`, the RFC 6962 leaf hash of the event's canonical form (`wire()`). Until
    then both are empty. `tenant_id` is a plain column, not a foreign key: the trail
    outlives what it describes.
    """

    seq = models.BigAutoField(primary_key=True)
    id = models.CharField(max_length=32, unique=True, default=_new_audit_id, editable=False)
    tenant_id = models.CharField(max_length=32, db_index=True)
    position = models.BigIntegerField(null=True)
    leaf_hash = models.CharField(max_length=64, blank=True)
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
    txid = models.BigIntegerField(null=True, editable=False,
                                  help_text="The writing transaction's id (sequencing order).")

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["tenant_id", "seq"], name="audit_event_tenant_seq"),
                   models.Index(fields=["tenant_id", "txid"], name="audit_event_unnumbered",
                                condition=models.Q(position__isnull=True))]
        constraints = [models.UniqueConstraint(fields=["tenant_id", "position"],
                                               name="audit_auditevent_one_per_position")]

    def __str__(self) -> str:
        return f"{self.action} {self.target} by {self.actor_id}"

    def wire(self) -> dict[str, Any]:
        """The canonical form that is hashed as the Merkle leaf and shown in proofs."""
        return {
            "v": 1, "tenantId": self.tenant_id, "position": self.position, "id": self.id,
            "actorId": self.actor_id, "action": self.action, "target": self.target,
            "allowed": self.allowed, "reason": self.reason, "decisionId": self.decision_id,
            "requestId": self.request_id, "origin": self.origin, "data": self.data,
            "createdAt": self.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
        }


class AuditHead(models.Model):
    """How many events of a tenant have positions; the sequencer holds its row."""

    tenant_id = models.CharField(max_length=32, primary_key=True)
    size = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.size}"


class Checkpoint(models.Model):
    """A signed tree head over a tenant's first `tree_size` events.

    `frontier` lets the next checkpoint continue in O(new events); `consistency` is the
    RFC 6962 proof that this tree extends the previous checkpoint's.
    """

    id = models.CharField(max_length=32, primary_key=True, default=_new_checkpoint_id,
                          editable=False)
    tenant_id = models.CharField(max_length=32, db_index=True)
    tree_size = models.BigIntegerField()
    root_hash = models.CharField(max_length=64)
    frontier = models.JSONField(default=list)
    consistency = models.JSONField(default=list)
    previous = models.OneToOneField("self", null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="next")
    signed_at = models.CharField(max_length=40)
    signature = models.CharField(max_length=128)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant_id", "tree_size"]
        constraints = [models.UniqueConstraint(fields=["tenant_id", "tree_size"],
                                               name="audit_checkpoint_one_per_size")]

    def __str__(self) -> str:
        return f"{self.tenant_id} @ {self.tree_size}"

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "tenantId": self.tenant_id, "treeSize": self.tree_size,
                "rootHash": self.root_hash, "previous": self.previous_id,
                "signedAt": self.signed_at, "signature": self.signature}


__all__ = ["AuditEvent", "AuditHead", "Checkpoint", "SealedSecret"]
