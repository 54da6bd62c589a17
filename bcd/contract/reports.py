"""What a node signs when it reports: one statement per report, over everything the control
plane acts on (its kind, id, session epoch and body, and a command result's command and
status), so a gateway that relays it can neither forge one nor pass one off as another.

Django-free: the agent signs with it and the control plane verifies with it.
"""

from __future__ import annotations

from bcd.contract.crypto import canonical

# Reports that change what the control plane believes; each is signed (AgentMessage.signature).
REPORT_KINDS = ("inventory", "telemetry", "command_result", "bound", "released", "failed", "vm")


def statement(*, kind: str, report_id: str, epoch: int, body: str, command_id: str = "",
              status: str = "") -> bytes:
    """The bytes a node signs for one report."""
    return canonical({"v": 1, "kind": kind, "reportId": report_id, "epoch": int(epoch),
                      "body": body, "commandId": command_id, "status": status})
