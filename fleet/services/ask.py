"""Reading something only the node knows (a VM's console): a command whose answer the call
waits for, a short while."""

from __future__ import annotations

import time
from typing import Any

from compute.core.errors import ComputeError, Unavailable
from fleet.models import CommandState, NodeCommand
from fleet.services.specs import command_create, desired_state_changed

ASK_SECONDS = 15.0


def node_ask(*, node_id: str, kind: str, payload: dict[str, Any],
             timeout: float = ASK_SECONDS,
             refused: type[ComputeError] = Unavailable) -> dict[str, Any]:
    """Queue a read-only command for the node and wait for its signed result's output.
    The node runs it at most once, like every command; no ledger state changes."""
    command = command_create(node_id=node_id, kind=kind, payload=payload)
    desired_state_changed()
    return command_wait(command, timeout=timeout, refused=refused)


def command_wait(command: NodeCommand, *, timeout: float = ASK_SECONDS,
                 refused: type[ComputeError] = Unavailable) -> dict[str, Any]:
    """The output of a queued command's signed result, once the node answered; a command
    the node has not taken within `timeout` is withdrawn (one it took is left to finish:
    its result is kept on the command). A node that answered it failed raises `refused`
    with the node's reason (Unavailable unless the caller knows the failure is its
    request's, such as a file that is not there); an outcome unknown is Unavailable."""
    node_id = command.node_id
    deadline = time.monotonic() + timeout
    pause = 0.02
    while time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)
        command.refresh_from_db(fields=["state", "result"])
        if command.state == CommandState.SUCCEEDED:
            return dict((command.result or {}).get("output") or {})
        if command.state in (CommandState.FAILED, CommandState.UNKNOWN):
            error = ((command.result or {}).get("output") or {}).get("error", command.state)
            failure = refused if command.state == CommandState.FAILED else Unavailable
            raise failure(f"node {node_id} could not do it: {error}", nodeId=node_id,
                          commandId=command.id)
    NodeCommand.objects.filter(pk=command.pk, state=CommandState.QUEUED).update(
        state=CommandState.FAILED, result={"status": "failed",
                                           "output": {"error": "not answered in time"}})
    raise Unavailable(f"node {node_id} did not answer within {timeout:.0f} s (is it "
                      "connected?)", nodeId=node_id, commandId=command.id)
