"""The MCP server with the SDK's own client, over stdio and over streamable HTTP, against a
live API: every API method is a tool with its input schema, a reservation is made and read
back as a resource, a viewer's write is refused with the envelope's error, and a caller
with no token is refused."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from compute.core.api.registry import REGISTRY
from tests.factories import make_node
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@asynccontextmanager
async def over_stdio(url: str, token: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE")}
    env.update(BETTER_COMPUTE_URL=url, BETTER_COMPUTE_TOKEN=token)
    server = StdioServerParameters(command=sys.executable,
                                   args=["-m", "compute.cli.main", "mcp"], env=env)
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@pytest.fixture
def http_server(live_server):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE")}
    env["BETTER_COMPUTE_URL"] = live_server.url
    process = subprocess.Popen([sys.executable, "-m", "compute.cli.main", "mcp", "--http",
                                f"127.0.0.1:{port}"], env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(10)


@asynccontextmanager
async def over_http(url: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    import httpx2

    async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
            streamable_http_client(url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


async def reserve_and_read_back(session: ClientSession, pool_id: str) -> dict[str, Any]:
    made = await session.call_tool("reservations.create", {
        "poolId": pool_id, "devices": [{"class": "gpu", "count": 2}], "duration": 3_600_000})
    assert not made.is_error, made.content
    rsv = made.structured_content
    read = await session.read_resource(f"better-compute://reservations/{rsv['id']}")
    assert f'"id": "{rsv["id"]}"' in read.contents[0].text
    capacity = await session.read_resource(f"better-compute://capacity/{pool_id}")
    assert '"allocated": 2' in capacity.contents[0].text
    return rsv


@pytest.fixture
def gpu_pool(root, pool):
    make_node(pool["id"])
    return pool


def test_over_stdio_every_method_is_a_tool_and_a_reservation_round_trips(
        live_server, root_token, gpu_pool, root):
    viewer = root("tokens.create", name="looker", role="viewer")["token"]

    async def session_work():
        async with over_stdio(live_server.url, root_token) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert set(tools) == {f"{g}.{m}" for g, m in REGISTRY} | {"sandbox_run"}
            assert all(tool.input_schema.get("type") == "object" for tool in tools.values())
            assert tools["reservations.get"].annotations.read_only_hint is True
            assert tools["reservations.release"].annotations.destructive_hint is True
            assert tools["reservations.create"].annotations.destructive_hint is False
            templates = (await session.list_resource_templates()).resource_templates
            assert {t.uri_template for t in templates} == {
                "better-compute://capacity/{pool}", "better-compute://reservations/{id}"}
            rsv = await reserve_and_read_back(session, gpu_pool["id"])
        async with over_stdio(live_server.url, viewer) as session:
            return await session.call_tool("reservations.release",
                                              {"reservationId": rsv["id"]})

    refused = asyncio.run(session_work())
    assert refused.is_error
    assert refused.content[0].text.startswith("permission_denied: not allowed")
    assert "(request req_" in refused.content[0].text


def test_over_http_the_bearer_token_is_the_caller_and_none_is_refused(
        http_server, root_token, gpu_pool):
    async def session_work():
        async with over_http(http_server, root_token) as session:
            await reserve_and_read_back(session, gpu_pool["id"])
        async with over_http(http_server, None) as session:
            listed = await session.list_tools()  # the catalogue is public, like the OpenAPI
            refused = await session.call_tool("pools.list", {})
        return listed, refused

    listed, refused = asyncio.run(session_work())
    assert len(listed.tools) == len(REGISTRY) + 1  # and sandbox_run
    assert refused.is_error
    assert refused.content[0].text.startswith("unauthenticated: no API token")


def test_the_token_is_never_a_tool_argument():
    from compute.cli.mcp import tool_of
    from compute.http.openapi import envelope_operations

    for operation in envelope_operations():
        schema = tool_of(operation).input_schema
        assert not {"token", "authorization"} & {k.lower() for k in schema["properties"]}
