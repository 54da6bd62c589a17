"""API methods audit.checkpoint, audit.checkpoints, audit.verify, audit.prove, audit.list."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from audit import checkpoints
from audit.selectors import audit_event_id_for, audit_event_list, checkpoint_list
from compute.core.api.inputs import Input, ListInput
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import (
    BOOLEAN,
    INTEGER,
    OBJECT,
    STRING,
    TIME,
    array,
    items_of,
    nullable,
    obj,
)


class CheckpointIn(Input):
    pass


CHECKPOINT = obj(id=STRING, tenantId=STRING, treeSize=INTEGER, rootHash=STRING,
                 previous=nullable(STRING), signedAt=TIME, signature=STRING)
CHECKPOINT_SUMMARY = obj(id=STRING, treeSize=INTEGER, rootHash=STRING, signedAt=TIME)
VERIFICATION = obj(ok=BOOLEAN, tenantId=STRING, checkedEvents=INTEGER,
                   checkedCheckpoints=INTEGER, firstBadPosition=nullable(INTEGER),
                   problem=nullable(STRING))
LEAF = obj(v=INTEGER, tenantId=STRING, position=INTEGER, id=STRING, actorId=STRING,
           action=STRING, target=STRING, allowed=BOOLEAN, reason=STRING, decisionId=STRING,
           requestId=STRING, origin=STRING, data=OBJECT, createdAt=TIME)
PROOF = obj(version=INTEGER, event=LEAF, leafIndex=INTEGER, treeSize=INTEGER,
            auditPath=array(STRING), checkpoint=CHECKPOINT, publicKey=STRING)
AUDIT_ROW = obj(id=STRING, position=INTEGER, action=STRING, allowed=BOOLEAN, actorId=STRING,
                target=nullable(STRING), reason=nullable(STRING), requestId=nullable(STRING),
                origin=STRING, data=OBJECT, createdAt=TIME)


@endpoint("audit", "checkpoint", returns=nullable(CHECKPOINT), input=CheckpointIn, mutating=True)
def audit_checkpoint(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any] | None:
    """Sign a checkpoint over the tenant's new audit events now (also done hourly)."""
    checkpoint = checkpoints.checkpoint_seal(tenant_id=ctx.tenant.id, actor_id=ctx.principal.id)
    return checkpoint.wire() if checkpoint else None


class VerifyIn(Input):
    from_position = serializers.IntegerField(required=False, min_value=1, default=1)
    to_position = serializers.IntegerField(required=False, min_value=1)


@endpoint("audit", "verify", returns=VERIFICATION, input=VerifyIn, mutating=False)
def audit_verify(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Recompute the tenant's audit log and checkpoints; name the first bad position."""
    return checkpoints.audit_verify(tenant_id=ctx.tenant.id, **data).wire()


class ProveIn(Input):
    event_id = serializers.RegexField(r"^[a-z]{2,5}_[0-9a-z]{26}$", max_length=32,
                                      help_text="An audit event id (aud_…), or the id of "
                                                "the object it is about (its latest event).")


@endpoint("audit", "prove", returns=PROOF, input=ProveIn, mutating=False)
def audit_prove(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """An inclusion proof of one audit event against the latest checkpoint."""
    event_id = audit_event_id_for(tenant_id=ctx.tenant.id, ref=data["event_id"])
    return checkpoints.audit_prove(tenant_id=ctx.tenant.id, event_id=event_id)


class AuditListIn(ListInput):
    action = serializers.CharField(required=False, max_length=64,
                                   help_text="Such as node.join, or node.* for a prefix.")
    allowed = serializers.BooleanField(required=False, allow_null=True, default=None,
                                       help_text="false: only refusals.")
    target = serializers.CharField(required=False, max_length=64)
    since = serializers.IntegerField(required=False, min_value=0, default=0,
                                     help_text="Rows after this position.")
    before = serializers.IntegerField(
        required=False, min_value=1, help_text="Rows before this position: the newest "
        "`limit` of them, still oldest first (a page going back from the newest).")


@endpoint("audit", "list", returns=items_of(AUDIT_ROW, nextSince=INTEGER),
          input=AuditListIn, mutating=False)
def audit_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The tenant's audit rows, oldest first: who did (or was refused) what, and why."""
    rows = audit_event_list(tenant_id=ctx.tenant.id, action=data.get("action"),
                            allowed=data["allowed"], target=data.get("target"),
                            since=data["since"], before=data.get("before"),
                            limit=data["limit"])
    items = [{"id": row.id, "position": row.position, "action": row.action,
              "allowed": row.allowed, "actorId": row.actor_id, "target": row.target or None,
              "reason": row.reason or None, "requestId": row.request_id or None,
              "origin": row.origin, "data": row.data, "createdAt": row.created_at}
             for row in rows]
    return {"items": items, "nextSince": items[-1]["position"] if items else data["since"]}


class CheckpointListIn(Input):
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=20)


@endpoint("audit", "checkpoints", returns=items_of(CHECKPOINT_SUMMARY),
          input=CheckpointListIn, mutating=False)
def audit_checkpoints(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The tenant's signed checkpoints, newest first: how many events each covers and the
    Merkle root it signs."""
    return {"items": [{"id": c.id, "treeSize": c.tree_size, "rootHash": c.root_hash,
                       "signedAt": c.signed_at}
                      for c in checkpoint_list(tenant_id=ctx.tenant.id, limit=data["limit"])]}
