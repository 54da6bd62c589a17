"""The fleet's kinds of work item handled above it: a GPU whose health changed is offered to
the ledger (reservations.reconcilers), which applies the pool's `onDeviceFailure` to a
failed one and offers a healed one to the pool's pending reservations; a node that sent
telemetry has its holds checked for idleness (offerings' idle reclaim)."""

from __future__ import annotations

from compute.queue.work import enqueue

DEVICE = "device"
TELEMETRY = "telemetry"


def device_health_changed(device_id: str) -> None:
    """Queued in the transaction that recorded the failure, so it exists exactly then."""
    enqueue(DEVICE, device_id)


def node_telemetry_recorded(node_id: str) -> None:
    enqueue(TELEMETRY, node_id)
