"""Idempotency keys: the same key with the same input returns the same object.

A create service calls `idempotent_lookup` first and `idempotent_remember` last, inside its
own transaction. The lookup takes an advisory lock on the key, so two concurrent calls with
one key serialize and the second sees the first's object.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import models
from django.utils import timezone

from compute.core.db import advisory_xact_lock
from compute.core.errors import IdempotencyMismatch


class IdempotencyRecord(models.Model):
    """The object a (tenant, scope, key) created, and a fingerprint of the input that made it."""

    tenant = models.ForeignKey("compute.Tenant", on_delete=models.CASCADE)
    scope = models.CharField(max_length=64)
    key = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64)
    object_id = models.CharField(max_length=32)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "scope", "key"],
                                    name="compute_idempotencyrecord_key_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.scope}:{self.key} -> {self.object_id}"


def fingerprint(**inputs: Any) -> str:
    canonical = json.dumps(inputs, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def idempotent_lookup(*, tenant_id: str, scope: str, key: str | None,
                      inputs: dict[str, Any]) -> str | None:
    """Return the id made earlier with this key, None for a new key; 409 if the input differs."""
    if not key:
        return None
    advisory_xact_lock(f"idem:{tenant_id}:{scope}:{key}")
    record = IdempotencyRecord.objects.filter(tenant_id=tenant_id, scope=scope, key=key).first()
    if record is None:
        return None
    if record.fingerprint != fingerprint(**inputs):
        raise IdempotencyMismatch(
            f"idempotency key {key!r} was already used with different input",
            idempotencyKey=key, objectId=record.object_id)
    return record.object_id


def idempotent_remember(*, tenant_id: str, scope: str, key: str | None,
                        inputs: dict[str, Any], object_id: str) -> None:
    if key:
        IdempotencyRecord.objects.create(tenant_id=tenant_id, scope=scope, key=key,
                                         fingerprint=fingerprint(**inputs), object_id=object_id)
