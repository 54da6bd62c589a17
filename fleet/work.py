"""The fleet's kinds of work item handled above it: a GPU whose health changed is offered to
the ledger (reservations.reconcilers), which applies the pool's `onDeviceFailure` to a
failed one and offers a healed one to the pool's pending reservations."""

from __future__ import annotations

from compute.queue.work import enqueue

DEVICE = "device"


def device_health_changed(device_id: str) -> None:
    """Queued in the transaction that recorded the failure, so it exists exactly then."""
    enqueue(DEVICE, device_id)
