"""NodeLifecycle: adopting -> (acceptance checks) -> adopted, or a sticky acceptance failure.

The first inventory of an adopting node starts an attempt: each check of the pool policy
(such as `diag.nvml`) becomes a command for the agent. When every check passes, the node is
adopted and the placer considers it; a failure stays until an operator calls nodes.adopt.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from compute.db import retrying
from compute.errors import InvalidState
from compute.tenancy.models import Principal, Tenant
from fleet.models import CommandState, Device, Health, Node, NodeCommand, ProvisionState
from fleet.selectors import access_node_by_id
from fleet.services.nodes import node_adopt_locked, node_event


def acceptance_start_locked(node: Node, *, actor_id: str, reason: str = "") -> list[NodeCommand]:
    """Queue the pool's acceptance checks for `node` (its row locked by the caller)."""
    policy = node.pool.policy or {}
    checks = [c["kind"] for c in policy.get("acceptance", [])]
    attempt = int(node.acceptance.get("attempt", 0)) + 1
    commands = [NodeCommand.objects.create(node=node, kind=kind,
                                           payload={"expect": policy.get("expect", {}),
                                                    "acceptance": attempt})
                for kind in checks]
    node.acceptance = {"attempt": attempt, "state": "running", "reason": reason,
                       "commands": [c.id for c in commands],
                       "startedAt": timezone.now().isoformat()}
    node.save(update_fields=["acceptance"])
    node_event(node, "node.acceptance.started", actor_id, "node.acceptance.start",
               checks=checks, attempt=attempt)
    if not commands:
        node_adopt_locked(node, actor_id=actor_id, checks=[])
    return commands


def _passes(command: NodeCommand, status: str, output: dict[str, Any]) -> tuple[bool, str]:
    """Trust, but verify: the control plane re-checks what the agent observed."""
    expect = command.payload.get("expect", {})
    if command.kind == "diag.nvml" and "gpuCount" in expect:
        healthy = int(output.get("healthyGpus", -1))
        known = Device.objects.filter(node=command.node, present=True, device_class="gpu",
                                      health=Health.HEALTHY).count()
        if status != "succeeded" or healthy < expect["gpuCount"] or known < expect["gpuCount"]:
            return False, (f"diag.nvml: {max(healthy, 0)} healthy GPUs reported, "
                           f"{known} in inventory, expected {expect['gpuCount']}")
    if status != "succeeded":
        return False, str(output.get("error") or f"{command.kind} {status}")
    return True, "passed"


@retrying
@transaction.atomic(durable=True)
def command_result_record(*, node_id: str, command_id: str, status: str,
                          output: dict[str, Any]) -> NodeCommand | None:
    """Record an agent's result for one of its commands (a repeat changes nothing)."""
    command = (NodeCommand.objects.select_for_update().select_related("node__pool")
               .filter(pk=command_id, node_id=node_id).first())
    if command is None or command.state in (CommandState.SUCCEEDED, CommandState.FAILED,
                                            CommandState.UNKNOWN):
        return command
    command.state = {"succeeded": CommandState.SUCCEEDED,
                     "unknown": CommandState.UNKNOWN}.get(status, CommandState.FAILED)
    command.result = {"status": status, "output": output}
    command.finished_at = timezone.now()
    command.save(update_fields=["state", "result", "finished_at"])
    if "acceptance" in command.payload:
        _acceptance_progress(Node.objects.select_for_update().select_related("pool")
                             .get(pk=node_id), command, status, output)
    return command


def _acceptance_progress(node: Node, command: NodeCommand, status: str,
                         output: dict[str, Any]) -> None:
    if node.provision_state != ProvisionState.ADOPTING or node.acceptance.get(
            "attempt") != command.payload.get("acceptance"):
        return  # a result of an older attempt
    ok, why = _passes(command, status, output)
    if not ok:
        node.provision_state = ProvisionState.ACCEPTANCE_FAILED
        node.acceptance = {**node.acceptance, "state": "failed", "failure": why}
        node.save(update_fields=["provision_state", "acceptance"])
        node_event(node, "node.acceptance.failed", node.id, "node.acceptance.fail", reason=why)
        return
    done = NodeCommand.objects.filter(pk__in=node.acceptance.get("commands", []),
                                      state=CommandState.SUCCEEDED).count()
    if done == len(node.acceptance.get("commands", [])):
        node.acceptance = {**node.acceptance, "state": "passed"}
        node.save(update_fields=["acceptance"])
        node_adopt_locked(node, actor_id=node.id, checks=[command.kind])


@retrying
@transaction.atomic(durable=True)
def node_adopt_again(*, tenant: Tenant, actor: Principal, node_id: str, reason: str) -> Node:
    """After fixing the cause of a failed acceptance, start a new attempt."""
    node = access_node_by_id(tenant=tenant, node_id=node_id, lock=True)
    if node.provision_state != ProvisionState.ACCEPTANCE_FAILED:
        raise InvalidState(f"node {node.id} is {node.provision_state}; only a node whose "
                           "acceptance failed can be adopted again",
                           provisionState=node.provision_state)
    node.provision_state = ProvisionState.ADOPTING
    node.save(update_fields=["provision_state"])
    acceptance_start_locked(node, actor_id=actor.id, reason=reason)
    return node
