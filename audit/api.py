"""API methods audit.checkpoint, audit.verify, audit.prove."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from audit import checkpoints
from compute.api.inputs import Input, PublicIdField
from compute.api.registry import CallContext, endpoint


class CheckpointIn(Input):
    pass


@endpoint("audit", "checkpoint", input=CheckpointIn, mutating=True)
def audit_checkpoint(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any] | None:
    """Sign a checkpoint over the tenant's new audit events now (also done hourly)."""
    checkpoint = checkpoints.checkpoint_seal(tenant_id=ctx.tenant.id, actor_id=ctx.principal.id)
    return checkpoint.wire() if checkpoint else None


class VerifyIn(Input):
    from_position = serializers.IntegerField(required=False, min_value=1, default=1)
    to_position = serializers.IntegerField(required=False, min_value=1)


@endpoint("audit", "verify", input=VerifyIn, mutating=False)
def audit_verify(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Recompute the tenant's audit log and checkpoints; name the first bad position."""
    return checkpoints.audit_verify(tenant_id=ctx.tenant.id, **data).wire()


class ProveIn(Input):
    event_id = PublicIdField("aud")


@endpoint("audit", "prove", input=ProveIn, mutating=False)
def audit_prove(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """An inclusion proof of one audit event against the latest checkpoint."""
    return checkpoints.audit_prove(tenant_id=ctx.tenant.id, event_id=data["event_id"])
