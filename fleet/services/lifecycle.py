"""NodeLifecycle: adopting -> (acceptance checks) -> adopted, or a sticky acceptance failure.

The first inventory of an adopting node starts an attempt: each check of the pool policy
(such as `diag.nvml`) becomes a command for the agent. When every check passes, the node is
adopted and the placer considers it; a failure stays until an operator calls nodes.adopt.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from audit.services import audit_record, audited
from compute.core.errors import InvalidState
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.models import (
    CommandState,
    Device,
    Health,
    Node,
    NodeCommand,
    NodeRole,
    ProvisionState,
)
from fleet.selectors import access_node_by_id
from fleet.services.baremetal import UNCHANGED, bmc_result_locked
from fleet.services.nodes import node_adopt_locked, node_event
from fleet.services.specs import command_create, desired_state_changed

FINISHED = (CommandState.SUCCEEDED, CommandState.FAILED, CommandState.UNKNOWN)
ACCEPTING = (ProvisionState.ADOPTING, ProvisionState.DEPLOYED)


def acceptance_start_locked(node: Node, *, reason: str = "") -> list[NodeCommand]:
    """Queue the pool's acceptance checks for `node` (its row locked by the caller). A
    provisioner has no capacity to accept: it is adopted as it is."""
    policy = node.pool.policy or {}
    wanted = policy.get("acceptance", []) if node.role == NodeRole.NODE else []
    required = (policy.get("profile") or {}).get("required") or []
    if required and node.role == NodeRole.NODE:  # the units the pool cannot do without
        wanted = [*wanted, {"kind": "profile.check", "params": {"units": list(required)}}]
    checks = [c["kind"] for c in wanted]
    attempt = int(node.acceptance.get("attempt", 0)) + 1
    commands = [command_create(node_id=node.id, kind=check["kind"], payload={
        "expect": policy.get("expect", {}), "hostShare": policy.get("hostShare", {}),
        "params": check.get("params", {}), "acceptance": attempt})
        for check in wanted]
    if commands:
        desired_state_changed()
    node.acceptance = {"attempt": attempt, "state": "running", "reason": reason,
                       "commands": [c.id for c in commands],
                       "startedAt": timezone.now().isoformat()}
    node.save(update_fields=["acceptance"])
    node_event(node, FleetEvent.NODE_ACCEPTANCE_STARTED, checks=checks, attempt=attempt)
    if not commands:
        node_adopt_locked(node, checks=[])
    return commands


def _passes(command: NodeCommand, status: str, output: dict[str, Any]) -> tuple[bool, str]:
    """The agent's verdict and reason; then trust, but verify: a GPU count that the agent
    says passed is checked again against the inventory the ledger holds."""
    if status != "succeeded":
        return False, f"{command.kind}: {output.get('error') or status}"
    expect = command.payload.get("expect", {})
    if command.kind == "diag.nvml" and "gpuCount" in expect:
        healthy = int(output.get("healthyGpus", -1))
        known = Device.objects.filter(node=command.node, present=True, device_class="gpu",
                                      health=Health.HEALTHY).count()
        if healthy < expect["gpuCount"] or known < expect["gpuCount"]:
            return False, (f"diag.nvml: {max(healthy, 0)} healthy GPUs reported, "
                           f"{known} in inventory, expected {expect['gpuCount']}")
    return True, "passed"


def command_result_locked(node: Node, *, command_id: str, status: str,
                          output: dict[str, Any]) -> dict[str, Any] | None:
    """Record an agent's result for one of its commands (the node row locked by the caller);
    returns a summary for the caller's audit row, or None when nothing changed (an unknown
    command, or a repeat of a finished one)."""
    command = (NodeCommand.objects.select_for_update(no_key=True).select_related("node__pool")
               .filter(pk=command_id, node_id=node.id).first())
    if command is None or command.state in FINISHED:
        return None
    command.state = {"succeeded": CommandState.SUCCEEDED,
                     "unknown": CommandState.UNKNOWN}.get(status, CommandState.FAILED)
    command.result = {"status": status, "output": output}
    command.finished_at = timezone.now()
    command.save(update_fields=["state", "result", "finished_at"])
    summary: dict[str, Any] = {"commandId": command.id, "kind": command.kind,
                               "status": status}
    if "acceptance" in command.payload:
        summary["acceptance"] = _acceptance_progress(node, command, status, output)
    if command.kind.startswith("bmc."):
        summary["provision"] = bmc_result_locked(command, status, output)
        if summary["provision"] == UNCHANGED:
            return None  # a poll that found the BMC as it was
    return summary


@audited
def command_outcome_unknown(*, command_id: str) -> None:
    """Settle, once, what a command lost with its node's journal was doing: a provision
    step it ran for a machine ends failed, saying its outcome is unknown."""
    command = (NodeCommand.objects.select_for_update(no_key=True).select_related("node__pool")
               .filter(pk=command_id, state=CommandState.UNKNOWN, result__isnull=True).first())
    if command is None:
        return
    output = {"error": "the node lost its journal; whether it ran is unknown"}
    command.result = {"status": "unknown", "output": output}
    command.save(update_fields=["result"])
    summary: dict[str, Any] = {"commandId": command.id, "kind": command.kind,
                               "status": "unknown"}
    if command.kind.startswith("bmc."):
        summary["provision"] = bmc_result_locked(command, "unknown", output)
    audit_record(tenant_id=command.node.pool.tenant_id, actor_id=command.node_id,
                 action="node.command.result", target=command.node_id, data=summary,
                 reason="journal lost")


def _acceptance_progress(node: Node, command: NodeCommand, status: str,
                         output: dict[str, Any]) -> str:
    if node.provision_state not in ACCEPTING or node.acceptance.get(
            "attempt") != command.payload.get("acceptance"):
        return "stale"  # a result of an older attempt
    ok, why = _passes(command, status, output)
    if not ok:
        node.provision_state = ProvisionState.ACCEPTANCE_FAILED
        node.acceptance = {**node.acceptance, "state": "failed", "failure": why}
        node.save(update_fields=["provision_state", "acceptance"])
        node_event(node, FleetEvent.NODE_ACCEPTANCE_FAILED, reason=why)
        return "failed"
    done = NodeCommand.objects.filter(pk__in=node.acceptance.get("commands", []),
                                      state=CommandState.SUCCEEDED).count()
    if done < len(node.acceptance.get("commands", [])):
        return "running"
    node.acceptance = {**node.acceptance, "state": "passed"}
    node.save(update_fields=["acceptance"])
    node_adopt_locked(node, checks=[command.kind])
    return "passed"


@audited
def node_adopt_again(*, tenant: Tenant, actor: Principal, node_id: str, reason: str) -> Node:
    """After fixing the cause of a failed acceptance, start a new attempt."""
    node = access_node_by_id(tenant=tenant, node_id=node_id, lock=True)
    if node.provision_state != ProvisionState.ACCEPTANCE_FAILED:
        raise InvalidState(f"node {node.id} is {node.provision_state}; only a node whose "
                           "acceptance failed can be adopted again",
                           provisionState=node.provision_state)
    node.provision_state = ProvisionState.ADOPTING
    node.save(update_fields=["provision_state"])
    acceptance_start_locked(node, reason=reason)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="node.adopt", target=node.id,
                 reason=reason, data={"attempt": node.acceptance["attempt"]})
    return node
