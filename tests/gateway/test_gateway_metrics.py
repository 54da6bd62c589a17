"""The gateway's own series (sessions, heartbeat lag, acknowledged duplicates), its gRPC
health service, and the metrics endpoint a gateway or worker serves on a port of its own."""

from __future__ import annotations

import asyncio

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from bcd.contract.proto import agent_pb2 as pb
from tests.gateway.conftest import diag, session_for
from tests.gateway.test_sessions import joined
from tests.support.waiting import eventually


def series(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_sessions_heartbeats_and_duplicates_are_counted(fleet):
    credentials, _payload, inventory = joined(fleet)
    lag_before = series("bc_heartbeat_lag_seconds_count")
    duplicates_before = series("bc_report_duplicates_total")

    async def scenario():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run())
        assert await eventually(lambda: session.state.connected)
        open_now = series("bc_gateway_sessions")
        report = pb.AgentMessage(epoch=session.state.epoch, report_id="inv-1", inventory=pb.Report(
            json='{"hostname":"gpu-01","vcpus":96,"memoryGiB":1024,"gpus":[]}'))
        for _ in range(2):  # the same report twice: filed both times, applied once
            session.bulk.put_nowait(pb.AgentMessage.FromString(report.SerializeToString()))
        assert await eventually(lambda: len(session.state.acks) >= 2)
        task.cancel()
        return open_now, session.state.acks[:2]

    open_now, acks = asyncio.run(scenario())
    assert open_now == 1
    assert acks == [("inv-1", False), ("inv-1", False)]  # filed: the worker tells repeats
    assert asyncio.run(eventually(
        lambda: series("bc_report_duplicates_total") - duplicates_before == 1))
    assert series("bc_heartbeat_lag_seconds_count") > lag_before
    assert asyncio.run(eventually(lambda: series("bc_gateway_sessions") == 0))


def test_the_gateway_answers_the_standard_health_check(fleet):
    from gateway.server import AGENT_SERVICE

    async def check(service: str) -> int:
        creds = grpc.ssl_channel_credentials(fleet.wellknown["servingCaPem"].encode())
        async with grpc.aio.secure_channel(fleet.gateway.join_target, creds) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=10)
            return answer.status

    serving = health_pb2.HealthCheckResponse.SERVING
    assert asyncio.run(check("")) == serving
    assert asyncio.run(check(AGENT_SERVICE)) == serving


def test_a_process_serves_its_series_on_its_own_port(transactional_db):
    from compute.core.metrics import serve_metrics
    from tests.e2e.conftest import free_port

    port = free_port()
    serve_metrics(f"127.0.0.1:{port}")
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert "# TYPE bc_gateway_sessions gauge" in text
    assert "# TYPE bc_work_items_total counter" in text
