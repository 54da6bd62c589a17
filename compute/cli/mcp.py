"""`better-compute mcp`: the API as Model Context Protocol tools, over stdio or streamable HTTP.

Each API method is one tool, made from the OpenAPI document the API serves (name, summary,
the JSON Schema of its input), so a new method needs no MCP code. Calls go to the envelope
as the caller: the token is BETTER_COMPUTE_TOKEN (stdio) or the HTTP request's bearer token,
never a tool argument, and IAM decides each call as for any client. Writes that take an
idempotency key get one when the model gives none. Reads carry MCP's read-only hint,
releases and revocations the destructive hint. Resources: better-compute://capacity/{pool}
and better-compute://reservations/{id}.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Any

import httpx
from mcp import types
from mcp.server.lowlevel import Server

from bcd.contract.version import version
from compute.client.transport import ApiError, ClientError, Transport
from compute.core import config

DESTRUCTIVE = ("release", "revoke")
RESOURCES = {
    "capacity": ("better-compute://capacity/{pool}", "capacity.get", "poolId",
                 "A pool's capacity: total, allocatable, allocated, reserved, available."),
    "reservations": ("better-compute://reservations/{id}", "reservations.get",
                     "reservationId", "One reservation with its window, node and binding."),
}
RESOURCE_URI = re.compile(r"^better-compute://(capacity|reservations)/([a-z]+_[0-9a-z]{26})$")


def load_operations(url: str) -> dict[str, dict[str, Any]]:
    """operationId -> its operation, from the API's OpenAPI document."""
    base = url.rstrip("/").removesuffix("/api/compute")
    document = httpx.get(f"{base}/api/compute/openapi.json", timeout=30).json()
    return {path["post"]["operationId"]: path["post"] for path in document["paths"].values()
            if "post" in path}  # the envelope methods (the watch stream is a GET)


def tool_of(operation: dict[str, Any]) -> types.Tool:
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    name = operation["operationId"]
    mutating = bool(operation.get("x-mutating"))
    return types.Tool(
        name=name, description=operation.get("summary") or name, input_schema=schema,
        annotations=types.ToolAnnotations(
            title=name, read_only_hint=not mutating, idempotent_hint=not mutating,
            destructive_hint=mutating and name.split(".")[1] in DESTRUCTIVE,
            open_world_hint=False))


def _text(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


class Bridge:
    """The MCP server's handlers: tools and resources answered through the envelope."""

    def __init__(self, url: str, token_of: Any) -> None:
        self.url = url
        self.token_of = token_of  # the request context -> the caller's token, or ""
        self.operations = load_operations(url)

    def transport(self, ctx: Any) -> Transport:
        token = self.token_of(ctx)
        if not token:
            raise ClientError("unauthenticated: no API token (BETTER_COMPUTE_TOKEN for stdio, "
                              "Authorization: Bearer biam_… over HTTP)")
        return Transport(self.url, token, user_agent="better-compute-mcp")

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[*(tool_of(o) for o in self.operations.values()),
                                            SANDBOX_RUN])

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        if params.name == SANDBOX_RUN.name:
            try:
                result = await asyncio.to_thread(sandbox_run, self.transport(ctx),
                                                 dict(params.arguments or {}))
            except ApiError as refused:
                return _failure(f"{refused.code}: {refused.message}")
            except (ClientError, ValueError) as error:
                return _failure(str(error))
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=_text(result))],
                structured_content=result)
        operation = self.operations.get(params.name)
        if operation is None:
            return _failure(f"unknown tool {params.name}")
        arguments = dict(params.arguments or {})
        properties = operation["requestBody"]["content"]["application/json"]["schema"].get(
            "properties", {})
        if "idempotencyKey" in properties and not arguments.get("idempotencyKey"):
            arguments["idempotencyKey"] = f"mcp-{uuid.uuid4()}"
        try:
            result = self.transport(ctx).call(params.name, arguments,
                                              retry=not operation.get("x-mutating"))
        except ApiError as refused:
            return _failure(f"{refused.code}: {refused.message} (request {refused.request_id})"
                            + (f" {_text(refused.details)}" if refused.details else ""))
        except ClientError as error:
            return _failure(str(error))
        return types.CallToolResult(content=[types.TextContent(type="text", text=_text(result))],
                                    structured_content=result if isinstance(result, dict)
                                    else {"result": result})

    async def list_templates(self, ctx: Any, params: Any
                             ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(name=name, uri_template=template, description=about,
                                   mime_type="application/json")
            for name, (template, _, _, about) in RESOURCES.items()])

    async def list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])

    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        found = RESOURCE_URI.match(str(params.uri))
        if found is None:
            raise ValueError(f"{params.uri} is not a better-compute resource: "
                             + ", ".join(t for t, _, _, _ in RESOURCES.values()))
        _, method, field, _ = RESOURCES[found.group(1)]
        result = self.transport(ctx).call(method, {field: found.group(2)}, retry=True)
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=str(params.uri), mime_type="application/json", text=_text(result))])

    def server(self) -> Server[Any]:
        return Server("better-compute", version=version(),
                      instructions="GPU, CPU and sandbox capacity: reserve, inspect, release.",
                      on_list_tools=self.list_tools, on_call_tool=self.call_tool,
                      on_list_resources=self.list_resources,
                      on_list_resource_templates=self.list_templates,
                      on_read_resource=self.read_resource)


SANDBOX_RUN = types.Tool(
    name="sandbox_run",
    description="Run a shell command in a sandbox VM and return its exit code, stdout and "
                "stderr: in the sandbox named, or in a new one of the pool named (kept for "
                "the next call: pass back its sandboxId).",
    input_schema={"type": "object", "required": ["command"], "properties": {
        "command": {"type": "string", "description": "Run with sh -c in the guest."},
        "sandboxId": {"type": "string", "description": "A running sandbox to reuse."},
        "poolId": {"type": "string", "description": "Where to create one if none is named."},
        "vcpus": {"type": "integer", "minimum": 1, "default": 1},
        "memoryGiB": {"type": "integer", "minimum": 1, "default": 1},
        "image": {"type": "string"},
        "timeoutSeconds": {"type": "number", "minimum": 0.1, "maximum": 600, "default": 60}}},
    annotations=types.ToolAnnotations(title="sandbox_run", read_only_hint=False,
                                      idempotent_hint=False, destructive_hint=False,
                                      open_world_hint=False))
BOOT_SECONDS = 300.0


def sandbox_run(api: Transport, arguments: dict[str, Any]) -> dict[str, Any]:
    """Create-or-reuse, wait until running, run the command: what `sandbox_run` answers."""
    command = arguments.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError("command: a shell command is required")
    sandbox_id, made = arguments.get("sandboxId"), False
    if not sandbox_id:
        if not arguments.get("poolId"):
            raise ValueError("poolId: name a pool to create the sandbox in, or a sandboxId")
        created = api.call("sandboxes.create", {
            "poolId": arguments["poolId"], "vcpus": arguments.get("vcpus", 1),
            "memoryGiB": arguments.get("memoryGiB", 1), "image": arguments.get("image"),
            "idempotencyKey": f"mcp-{uuid.uuid4()}"}, retry=False)
        sandbox_id, made = created["id"], True
    deadline = time.monotonic() + BOOT_SECONDS
    while (state := api.call("sandboxes.get", {"sandboxId": sandbox_id},
                             retry=True)["state"]) in ("placed", "starting"):
        if time.monotonic() > deadline:
            if made:  # nothing of it is the caller's yet: give its vCPUs and memory back
                api.call("sandboxes.release", {"sandboxId": sandbox_id})
            raise ValueError(f"sandbox {sandbox_id} did not boot in {BOOT_SECONDS:.0f} s")
        time.sleep(0.25)
    if state != "running":
        raise ValueError(f"sandbox {sandbox_id} is {state}")
    said = api.call("sandboxes.exec", {
        "sandboxId": sandbox_id, "argv": ["sh", "-c", command],
        "timeoutSeconds": arguments.get("timeoutSeconds", 60)}, retry=False)
    return {"sandboxId": sandbox_id, **{k: said[k] for k in (
        "exitCode", "stdout", "stderr", "timedOut")}}


def _failure(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)],
                                is_error=True)


def bearer_of(ctx: Any) -> str:
    """The HTTP request's bearer token (streamable HTTP)."""
    headers = getattr(getattr(ctx, "request", None), "headers", None) or {}
    scheme, _, token = str(headers.get("authorization", "")).partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def serve_stdio(url: str) -> None:
    from mcp.server.stdio import stdio_server

    token = config.text("BETTER_COMPUTE_TOKEN")
    server = Bridge(url, lambda ctx: token).server()
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(url: str, host: str, port: int) -> None:
    import uvicorn

    app = Bridge(url, bearer_of).server().streamable_http_app(host=host)
    uvicorn.run(app, host=host, port=port, log_level="warning")
