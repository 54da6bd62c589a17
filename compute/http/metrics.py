"""`/metrics` (Prometheus exposition), `/healthz` (the process answers) and `/readyz` (the
database answers and every migration is applied: a load balancer sends traffic only then)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from compute.platform.queue.models import WorkItem
from reservations.models import Reservation

_RESERVATIONS, _WORK = Reservation._meta.db_table, WorkItem._meta.db_table
PENDING = f"SELECT pool_id, count(*) FROM {_RESERVATIONS} WHERE state = 'pending' GROUP BY 1"  # noqa: S608
QUEUE = (f"SELECT kind, count(*), EXTRACT(EPOCH FROM now() - min(due_at)) FROM {_WORK} "  # noqa: S608
         "WHERE due_at <= now() GROUP BY kind")


class LedgerCollector(Collector):
    """Series read from Postgres when scraped: what waits, and for how long."""

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily("bc_reservations_pending",
                                  "Reservations waiting for a placement, by pool.",
                                  labels=["pool"]),
                GaugeMetricFamily("bc_work_queue_depth", "Work items due, by kind.",
                                  labels=["kind"]),
                GaugeMetricFamily("bc_work_queue_oldest_seconds",
                                  "How long the oldest due work item has waited, by kind.",
                                  labels=["kind"]))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The names, without a query (registering asks, maybe where no database may be
        touched, such as while an ASGI server imports the URLs)."""
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pending, depth, oldest = self._families()
        try:
            with connection.cursor() as cursor:
                cursor.execute(PENDING)
                for pool_id, count in cursor.fetchall():
                    pending.add_metric([pool_id], count)
                cursor.execute(QUEUE)
                for kind, count, age in cursor.fetchall():
                    depth.add_metric([kind], count)
                    oldest.add_metric([kind], float(age))
        except DatabaseError:
            return  # /readyz says why; the process's own series are still served
        yield from (pending, depth, oldest)


REGISTRY.register(LedgerCollector())


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
