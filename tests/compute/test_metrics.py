"""/metrics in Prometheus' exposition format (parsed with prometheus-client's own parser),
/healthz and /readyz, the request id header and the one JSON log line per request."""

from __future__ import annotations

import json
import logging
import os
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import make_node


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples}


def value(series, series_name: str, **labels: str) -> float:
    return series.get((series_name, tuple(sorted(labels.items()))), 0.0)


def test_a_booking_moves_its_series(client, root, pool):
    make_node(pool["id"])
    before = scrape(client)
    booked = root("reservations.create", poolId=pool["id"], duration=3_600_000,
                  devices=[{"class": "gpu", "count": 2}])
    waiting = root("reservations.create", poolId=pool["id"], duration=3_600_000,
                   devices=[{"class": "gpu", "count": 8}])  # the node has 6 left: it waits
    refused = root.call("reservations.get", reservationId="rsv_01jbx0000000000000000000aa")
    after = scrape(client)
    assert (booked["state"], waiting["state"], refused.status) == ("binding", "pending", 404)
    ok = {"method": "reservations.create", "status": "200"}
    assert value(after, "bc_api_requests_total", **ok) - value(
        before, "bc_api_requests_total", **ok) == 2
    missing = {"method": "reservations.get", "status": "404"}
    assert value(after, "bc_api_requests_total", **missing) - value(
        before, "bc_api_requests_total", **missing) == 1
    timed = {"method": "reservations.create"}
    assert value(after, "bc_api_request_seconds_count", **timed) - value(
        before, "bc_api_request_seconds_count", **timed) == 2
    assert value(after, "bc_reservations_pending", pool=pool["id"], tenant="root") == 1
    assert_queue_series(client)


@pytest.mark.django_db(transaction=True)  # now() must move between create and release
def test_the_ledger_series_count_per_pool_and_tenant_what_the_ledger_holds(client, root, pool):
    from fleet.models import Device, GpuSample
    from reservations.models import UsageRecord

    node = make_node(pool["id"])
    placed = root("reservations.create", poolId=pool["id"], duration=3_600_000,
                  devices=[{"class": "gpu", "count": 3}])
    waiting = root("reservations.create", poolId=pool["id"], duration=3_600_000,
                   devices=[{"class": "gpu", "count": 8}])
    held = scrape(client)
    gpus = {state: value(held, "bc_pool_gpus", pool=pool["id"], state=state)
            for state in ("total", "allocatable", "allocated", "available", "unreachable")}
    assert gpus == {"total": 8, "allocatable": 8, "allocated": 3, "available": 5,
                    "unreachable": 0}
    assert value(held, "bc_tenant_atoms_allocated", pool=pool["id"], tenant="root",
                 **{"class": "gpu"}) == 3
    assert value(held, "bc_usage_rate", pool=pool["id"], tenant="root",
                 meter="gpu.H100.hours") == 3
    assert value(held, "bc_reservations_pending_oldest_seconds", pool=pool["id"],
                 tenant="root") >= 0
    assert value(held, "bc_pool_nodes", pool=pool["id"], connectivity=node.connectivity,
                 simulated="false") == 1
    assert value(held, "bc_pool_info", pool=pool["id"], name=pool["name"],
                 **{"class": pool["class"]}) == 1

    # Telemetry: the last fresh sample of each GPU, under dcgm-exporter's names.
    first, second = Device.objects.filter(node=node, device_class="gpu").order_by("index")[:2]
    now = timezone.now()
    GpuSample.objects.create(device=first, at=now - timedelta(seconds=40), utilization=10,
                             memory_used_mib=100)
    GpuSample.objects.create(device=first, at=now, utilization=87, memory_used_mib=4096)
    GpuSample.objects.create(device=second, at=now - timedelta(minutes=10), utilization=50)
    sampled = scrape(client)
    labels = {"gpu": str(first.index), "UUID": first.uuid, "device": f"nvidia{first.index}",
              "modelName": first.product, "Hostname": node.hostname, "node": node.id,
              "pool": pool["id"], "simulated": "false"}
    assert value(sampled, "DCGM_FI_DEV_GPU_UTIL", **labels) == 87
    assert value(sampled, "DCGM_FI_DEV_FB_USED", **labels) == 4096
    assert [key for key in sampled if key[0] == "DCGM_FI_DEV_GPU_UTIL"
            and ("UUID", second.uuid) in key[1]] == []  # stale: its node went quiet

    root("reservations.release", reservationId=waiting["id"])
    root("reservations.release", reservationId=placed["id"])
    released = scrape(client)
    [record] = UsageRecord.objects.filter(subject=placed["id"], meter="gpu.H100.hours")
    metered = record.quantity
    assert value(released, "bc_usage_metered_total", tenant="root",
                 meter="gpu.H100.hours") == pytest.approx(float(metered))
    assert value(released, "bc_usage_rate", pool=pool["id"], tenant="root",
                 meter="gpu.H100.hours") == 0


def assert_queue_series(client) -> None:
    from django.db.models import Count
    from django.utils import timezone

    from compute.platform.queue.models import WorkItem
    from compute.platform.queue.work import enqueue

    enqueue("test.metrics", "x")
    due = dict(WorkItem.objects.filter(due_at__lte=timezone.now()).values_list("kind")
               .annotate(n=Count("id")).values_list("kind", "n"))
    series = scrape(client)
    assert due["test.metrics"] == 1
    assert {kind: value(series, "bc_work_queue_depth", kind=kind) for kind in due} == due
    assert value(series, "bc_work_queue_oldest_seconds", kind="test.metrics") >= 0


def test_health_readiness_request_ids_and_the_request_log(client, root):
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("compute.requests")
    logger.addHandler(handler)
    try:
        answer = client.post("/api/compute/system/whoami", data="{}",
                             content_type="application/json",
                             headers={"Authorization": f"Bearer {root.token}"})
    finally:
        logger.removeHandler(handler)
    assert answer["X-Request-Id"] == answer.json()["requestId"]
    [line] = [json.loads(line) for line in lines]
    assert line["requestId"] == answer["X-Request-Id"]
    assert (line["method"], line["status"]) == ("system.whoami", 200)
    assert line["principal"] == answer.json()["result"]["principalId"]
    assert line["tenant"] == answer.json()["result"]["tenantId"]
    assert line["durationMs"] >= 0
    assert client.get("/healthz").json() == {"ok": True}
    assert client.get("/readyz").json() == {"ok": True}


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")),
                    reason="stops and starts the embedded server; DATABASE_URL names another")
def test_readyz_fails_while_the_database_is_stopped_and_recovers(client, embedded_postgres):
    from django.db import connections

    assert client.get("/readyz").status_code == 200
    connections.close_all()
    embedded_postgres.halt()
    try:
        down = client.get("/readyz")
        alive = client.get("/healthz").status_code
        series = client.get("/metrics").status_code  # the process's own series still served
    finally:
        embedded_postgres.start()
    assert (down.status_code, alive, series) == (503, 200, 200)
    assert "the database does not answer" in down.json()["problems"][0]
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")),
                    reason="stops and starts the embedded server; DATABASE_URL names another")
def test_a_call_while_the_database_is_down_is_unavailable_not_a_500(root, embedded_postgres):
    from django.db import connections

    connections.close_all()
    embedded_postgres.halt()
    try:
        down = root.raw("/api/compute/system/whoami", "{}")
    finally:
        embedded_postgres.start()
    assert (down.status, down.code) == (503, "unavailable"), down.body
    assert "the database does not answer" in down.body["error"]["message"]
    assert root.call("system.whoami").status == 200


@pytest.mark.django_db(transaction=True)
def test_a_read_whose_session_the_server_killed_is_run_again_a_write_is_not(root):
    from django.db import connection

    from compute.core.db import conninfo

    def kill_the_session() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            [pid] = cursor.fetchone()
        with psycopg.connect(conninfo(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])

    kill_the_session()
    again = root.call("tenants.get")  # its first try meets a killed session (57P01)
    assert again.status == 200, again.body
    kill_the_session()
    site = {"kind": "shared", "region": "eu-1", "idempotencyKey": "site-1"}
    write = root.call("sites.create", site)
    assert (write.status, write.code) == (503, "unavailable")  # not run twice behind its back
    assert write.body["error"]["details"]["retryAfterSeconds"] == 1
    retried = root.call("sites.create", site)  # the caller retries with its key
    assert retried.status == 200, retried.body
    assert root("sites.list")["items"] == [retried.result]
