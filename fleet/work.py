"""The fleet's kinds of work item handled above it: a GPU whose health changed is offered to
the ledger (reservations.reconcilers), which applies the pool's `onDeviceFailure` to a
failed one and offers a healed one to the pool's pending reservations; a node that sent
telemetry has its holds checked for idleness (offerings' idle reclaim); a node whose
reports the gateway filed has them verified and applied (fleet.reports)."""

from __future__ import annotations

from compute.platform.queue.work import enqueue

DEVICE = "device"
TELEMETRY = "telemetry"
REPORTS = "reports"
COMMAND = "command"


def device_health_changed(device_id: str) -> None:
    """Queued in the transaction that recorded the failure, so it exists exactly then."""
    enqueue(DEVICE, device_id)


def node_telemetry_recorded(node_id: str) -> None:
    enqueue(TELEMETRY, node_id)


def node_reports_filed(node_id: str) -> None:
    """The node's inbox has reports to verify and apply (fleet.reports)."""
    enqueue(REPORTS, node_id)


def command_outcome_lost(command_id: str) -> None:
    """A command its node's lost journal took with it: what it was doing is settled as
    unknown by a worker (fleet.reconcilers), not by the gateway that learned of the loss."""
    enqueue(COMMAND, command_id)
