"""The ledger's kinds of work item. A service queues an item inside its own transaction,
so the item exists exactly when the change that made it due has committed."""

from __future__ import annotations

from compute.platform.queue.work import enqueue

RESERVATION = "reservation"
POOL = "pool"
SERIES = "series"
SANDBOX = "sandbox"  # a sandbox whose time limit passed
GAPS = "gaps"  # a node whose whole groups' free time is stale (reservations.gaps)
USAGE_CLOSE = "usage.close"  # a running reservation or sandbox with an hour to meter
USAGE_SINK = "usage.sink"  # a metering sink with records to deliver (its key: the sink)


def pool_replan(pool_id: str) -> None:
    """Capacity of the pool freed up: a worker offers it to the pending reservations."""
    enqueue(POOL, pool_id)
