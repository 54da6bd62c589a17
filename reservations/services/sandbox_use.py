"""Using a sandbox: run a command in it, put a file in it, pause and resume it, and release
it when its time limit passes.

A command or a file goes to the sandbox's node as a signed one-shot command (the node runs
it at most once, journaled) which its guest agent carries out; the call that queued it then
waits for the node's signed result (`command_wait`). Pausing and resuming change what the
node's spec asks of the VM; the sandbox is `paused` (or `running` again) only when the node
reports, signed, that it did so.
"""

from __future__ import annotations

import base64
from datetime import datetime, timedelta
from typing import Any

from audit.services import audit_record, audited
from bcd.contract.vms import FILE_LIMIT
from compute.core.db import database_now
from compute.core.errors import InvalidArgument, InvalidState
from compute.platform.events.services import event_emit
from compute.platform.events.types import EventType
from compute.platform.tenancy.models import Principal, Tenant
from fleet.models import Node, NodeCommand
from fleet.services.specs import command_create, desired_state_changed, node_spec_change_locked
from reservations.events import ReservationEvent
from reservations.models.sandboxes import Sandbox, SandboxState
from reservations.selectors import access_sandbox_by_id

PAUSED_RATE = 0.1


def file_limit(sandbox: Sandbox) -> int:
    policy = sandbox.pool.policy.get("sandboxes") or {}
    return min(int(policy.get("maxFileBytes", FILE_LIMIT)), FILE_LIMIT)


def _running(tenant: Tenant, sandbox_id: str) -> Sandbox:
    sandbox = access_sandbox_by_id(tenant=tenant, sandbox_id=sandbox_id, lock=True)
    if sandbox.state != SandboxState.RUNNING:
        raise InvalidState(f"sandbox {sandbox.id} is {sandbox.state}, not running",
                           state=sandbox.state)
    return sandbox


@audited
def sandbox_exec(*, tenant: Tenant, actor: Principal, sandbox_id: str, argv: list[str],
                 timeout_seconds: float, detach: bool = False) -> NodeCommand:
    """Queue `argv` to run in the sandbox's guest, killed after `timeout_seconds`. The
    audit row names the program, not its arguments (they may carry what is not ours to
    keep)."""
    sandbox = _running(tenant, sandbox_id)
    return _guest_command(sandbox, actor, "vm.exec", {
        "argv": argv, "timeoutSeconds": timeout_seconds, "detach": detach},
        action="sandbox.exec", event=ReservationEvent.SANDBOX_EXEC,
        said={"program": argv[0][:200], "arguments": len(argv) - 1,
              "timeoutSeconds": timeout_seconds, "detach": detach})


@audited
def sandbox_put(*, tenant: Tenant, actor: Principal, sandbox_id: str, path: str,
                data: bytes) -> NodeCommand:
    """Queue writing `data` to `path` in the sandbox's guest (at most the pool's limit)."""
    sandbox = _running(tenant, sandbox_id)
    limit = file_limit(sandbox)
    if len(data) > limit:
        raise InvalidArgument(f"content: {len(data)} bytes is above pool {sandbox.pool_id}'s "
                              f"limit of {limit}", field="content", limit=limit)
    return _guest_command(sandbox, actor, "vm.put", {
        "path": path, "data": base64.b64encode(data).decode()},
        action="sandbox.put", event=ReservationEvent.SANDBOX_FILE_PUT,
        said={"path": path[:300], "bytes": len(data)})


def _guest_command(sandbox: Sandbox, actor: Principal, kind: str, payload: dict[str, Any],
                   *, action: str, event: EventType, said: dict[str, Any]) -> NodeCommand:
    """The node's command for the sandbox's guest, with its audit row and event."""
    command = command_create(node_id=sandbox.node_id, kind=kind,
                             payload={"sandboxId": sandbox.id, **payload})
    data = {"commandId": command.id, **said}
    audit_record(tenant_id=sandbox.tenant_id, actor_id=actor.id, action=action,
                 target=sandbox.id, data=data)
    event_emit(tenant_id=sandbox.tenant_id, type=event, subject=sandbox.id, payload=data)
    desired_state_changed()
    return command


@audited
def sandbox_pause(*, tenant: Tenant, actor: Principal, sandbox_id: str,
                  pause: bool = True) -> Sandbox:
    """Ask the node to stop (or run again) the guest's CPUs; the sandbox turns `paused`
    (`running`) when the node reports it did."""
    sandbox = access_sandbox_by_id(tenant=tenant, sandbox_id=sandbox_id, lock=True)
    wanted = "paused" if pause else "running"
    # A running sandbox may be paused; a paused one, or one whose pause is still asked,
    # resumed.
    allowed = (sandbox.state == SandboxState.RUNNING and sandbox.desired == "running"
               if pause else sandbox.desired == "paused"
               and sandbox.state in (SandboxState.RUNNING, SandboxState.PAUSED))
    if not allowed:
        raise InvalidState(f"sandbox {sandbox.id} is {sandbox.state} (asked: "
                           f"{sandbox.desired}): it cannot be "
                           f"{'paused' if pause else 'resumed'} now", state=sandbox.state)
    node = Node.objects.select_for_update(no_key=True).get(pk=sandbox.node_id)
    spec = node_spec_change_locked(node, vm_desired=(sandbox.id, wanted))
    sandbox.desired = wanted
    sandbox.save(update_fields=["desired"])
    data = {"desired": wanted, "generation": spec.generation}
    audit_record(tenant_id=tenant.id, actor_id=actor.id,
                 action="sandbox.pause" if pause else "sandbox.resume", target=sandbox.id,
                 data=data)
    event_emit(tenant_id=tenant.id, type=ReservationEvent.SANDBOX_PAUSE_ASKED,
               subject=sandbox.id, payload=data)
    return sandbox


def paused_rate(sandbox: Sandbox) -> float:
    return pool_paused_rate(sandbox.pool.policy)


def pool_paused_rate(policy: dict[str, Any]) -> float:
    """What a paused sandbox's time counts for under a pool's policy."""
    return float((policy.get("sandboxes") or {}).get("pausedRate", PAUSED_RATE))


def expires_at_for(policy: dict[str, Any], timeout_seconds: int | None) -> datetime | None:
    """When a new sandbox is released: its --timeout, bounded by the pool's maxLifetime."""
    limits = [s for s in (timeout_seconds, policy.get("maxLifetime")) if s]
    return database_now() + timedelta(seconds=min(limits)) if limits else None

