"""What a node reports (signed) about a sandbox's VM moves the sandbox, and nothing else does:
starting, then running once the guest said it booted; stopped after a release; failed when
it never booted or exited on its own. A repeated or stale report changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from audit.services import audit_record, audited
from compute.core.db import database_now
from compute.platform.events.services import event_emit
from compute.platform.events.types import EventType
from fleet.models import Node
from fleet.services.sessions import node_report_refused
from fleet.services.specs import node_spec_change_locked
from reservations.events import ReservationEvent
from reservations.models.sandboxes import LIVE, Sandbox, SandboxState
from reservations.services.binding import BindingRefused, verified_report
from reservations.services.sandboxes import sandbox_free_locked, sandbox_meter

S = SandboxState
# phase -> (states it moves from, state it moves to, event, audit action)
MOVES: dict[str, tuple[tuple[str, ...], str, EventType, str]] = {
    "starting": ((S.PLACED,), S.STARTING, ReservationEvent.SANDBOX_STARTING, "sandbox.start"),
    "started": ((S.PLACED, S.STARTING), S.RUNNING, ReservationEvent.SANDBOX_RUNNING, "sandbox.run"),
    "paused": ((S.RUNNING,), S.PAUSED, ReservationEvent.SANDBOX_PAUSED, "sandbox.paused"),
    "resumed": ((S.PAUSED,), S.RUNNING, ReservationEvent.SANDBOX_RESUMED, "sandbox.resumed"),
    "stopped": ((S.STOPPING,), S.STOPPED, ReservationEvent.SANDBOX_STOPPED, "sandbox.stop"),
    "failed": ((*LIVE, S.STOPPING), S.FAILED, ReservationEvent.SANDBOX_FAILED, "sandbox.fail"),
    "exited": ((*LIVE, S.STOPPING), S.FAILED, ReservationEvent.SANDBOX_FAILED, "sandbox.fail"),
}


def reported_end(payload: dict[str, Any], sandbox: Sandbox) -> datetime | None:
    """When the node says the VM ended (its clock), kept between the boot (or the creation)
    and now: a report that arrives late is metered to the end, not to its arrival."""
    said = payload.get("endedAt")
    if not isinstance(said, int | float) or isinstance(said, bool):
        return None
    now = database_now()
    try:
        moment = datetime.fromtimestamp(float(said), tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return min(max(moment, sandbox.started_at or sandbox.created_at), now)


def vm_report_record(*, node_id: str, body: str, signature: str) -> Sandbox | None:
    """Apply one signed VM report; a report that proves nothing is refused and audited."""
    try:
        return _apply(node_id, body, signature)
    except BindingRefused as refusal:
        node_report_refused(node_id=node_id, action="sandbox.report", reason=str(refusal))
        raise


@audited
def _apply(node_id: str, body: str, signature: str) -> Sandbox | None:
    _node, payload = verified_report(node_id, body, signature)
    phase = payload.get("phase")
    if phase not in MOVES:
        raise BindingRefused(f"unknown VM phase {str(phase)[:40]!r}")
    sandbox = (Sandbox.objects.select_for_update(no_key=True, of=("self",)).select_related("pool")
               .filter(pk=str(payload.get("sandboxId", ""))[:40], node_id=node_id).first())
    if sandbox is None:
        raise BindingRefused("no sandbox of this node has that id")
    sources, target, event, action = MOVES[phase]
    if sandbox.state not in sources:
        return sandbox  # a repeat, or news older than what the ledger knows
    reason = str(payload.get("reason") or "")[:300]
    status = payload.get("exitStatus")
    exit_status = status if isinstance(status, int) and not isinstance(status, bool) else None
    if phase == "exited":
        reason = reason or "the VM exited on its own"
    data: dict[str, Any] = {"nodeId": node_id, "phase": phase}
    if reason:
        data["reason"] = reason
    if exit_status is not None:
        data["exitStatus"] = exit_status
    if phase in ("paused", "resumed"):
        sandbox_meter(sandbox, database_now())  # the window before, at its own rate
        sandbox.state = target
        sandbox.save(update_fields=["state"])
    elif phase in ("starting", "started"):
        sandbox.state = target
        sandbox.accelerator = str(payload.get("accelerator") or "")[:8]
        fields = ["state", "accelerator"]
        if phase == "started":
            sandbox.started_at = database_now()
            fields.append("started_at")
        sandbox.save(update_fields=fields)
    else:
        node_spec_change_locked(Node.objects.select_for_update(no_key=True).get(pk=node_id),
                                vm_remove=sandbox.id)  # the node is done with it
        ended = reported_end(payload, sandbox)
        if ended is not None:
            data["endedAt"] = ended
        sandbox_free_locked(sandbox, to=target, reason=reason, exit_status=exit_status,
                            ended=ended)
    audit_record(tenant_id=sandbox.tenant_id, actor_id=node_id, action=action,
                 target=sandbox.id, data=data, reason=reason or "signed by node")
    event_emit(tenant_id=sandbox.tenant_id, type=event, subject=sandbox.id, payload=data)
    return sandbox
