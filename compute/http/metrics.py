"""`/metrics` (Prometheus exposition), `/healthz` (the process answers) and `/readyz` (the
database answers and every migration is applied: a load balancer sends traffic only then)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from compute.core.db import database_now
from compute.platform.queue.models import WorkItem
from compute.platform.webhooks.metrics import webhook_series
from fleet.metrics import fleet_series
from reservations.metrics import ledger_series

QUEUE = (f"SELECT kind, count(*), EXTRACT(EPOCH FROM now() - min(due_at)) "  # noqa: S608
         f"FROM {WorkItem._meta.db_table} WHERE due_at <= now() GROUP BY kind")


class DatabaseCollector(Collector):
    """Series read from Postgres when scraped: the work queue's, the ledger's
    (reservations.metrics), the fleet's (fleet.metrics) and webhooks' deliveries. A scrape
    costs about a dozen queries, each linear in the fleet (bench.metrics)."""

    def describe(self) -> Iterator[Metric]:
        """Nothing: registering asks, maybe where no database may be touched (such as while
        an ASGI server imports the URLs), and the names depend on no other collector."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        try:
            now = database_now()
            families = [*self._queue(), *ledger_series(now), *fleet_series(now),
                        *webhook_series()]
        except DatabaseError:
            return  # /readyz says why; the process's own series are still served
        yield from families

    @staticmethod
    def _queue() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        depth = GaugeMetricFamily("bc_work_queue_depth", "Work items due, by kind.",
                                  labels=["kind"])
        oldest = GaugeMetricFamily("bc_work_queue_oldest_seconds",
                                   "How long the oldest due work item has waited, by kind.",
                                   labels=["kind"])
        with connection.cursor() as cursor:
            cursor.execute(QUEUE)
            for kind, count, age in cursor.fetchall():
                depth.add_metric([kind], count)
                oldest.add_metric([kind], float(age))
        return depth, oldest


REGISTRY.register(DatabaseCollector())


def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


def healthz_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


def readyz_view(request: HttpRequest) -> JsonResponse:
    problems: list[str] = []
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        executor = MigrationExecutor(connection)
        plan: list[Any] = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if plan:
            problems.append(f"{len(plan)} migration(s) not applied, such as {plan[0][0]}")
    except DatabaseError as error:
        problems.append(f"the database does not answer: {str(error).strip()[:200]}")
        connection.close()  # the next look opens a new connection
    if problems:
        return JsonResponse({"ok": False, "problems": problems}, status=503)
    return JsonResponse({"ok": True})
