"""Run the work queue in the test's own process, as a worker would."""

from __future__ import annotations

from compute.queue.models import WorkItem
from compute.queue.work import Worker


def queued(kind: str, key: str) -> bool:
    return WorkItem.objects.filter(kind=kind, key=key).exists()


def run_due_work() -> int:
    """One worker pass over every due item; returns how many ran."""
    import fleet.reconcilers  # noqa: F401  (registers the handlers)
    import reservations.reconcilers  # noqa: F401

    worker = Worker("test-worker")
    try:
        return worker.run_once(limit=1000)
    finally:
        worker.release()
