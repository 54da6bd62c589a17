"""Run the work queue in the test's own process, as a worker would."""

from __future__ import annotations

import threading

from compute.platform.queue.models import WorkItem
from compute.platform.queue.work import Worker


def queued(kind: str, key: str) -> bool:
    return WorkItem.objects.filter(kind=kind, key=key).exists()


def run_due_work() -> int:
    """One worker pass over every due item; returns how many ran."""
    import compute.platform.webhooks.reconcilers  # noqa: F401  (registers the handlers)
    import fleet.reconcilers  # noqa: F401
    import reservations.reconcilers  # noqa: F401

    worker = Worker("test-worker")
    try:
        return worker.run_once(limit=1000)
    finally:
        worker.release()


class ReportsApplier(threading.Thread):
    """What a worker does with the reports a gateway files, in the background: each node's
    inbox applied every 20 ms (only that: other work waits for `run_due_work`)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import DatabaseError, connections

        from fleet.models import ReportInbox
        from fleet.reports import reconcile_reports

        try:
            while not self.stopping.wait(0.02):
                try:
                    for node_id in set(ReportInbox.objects.values_list("node_id", flat=True)):
                        reconcile_reports(node_id)
                except DatabaseError:  # Postgres restarting: a worker waits it out too
                    connections.close_all()
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
