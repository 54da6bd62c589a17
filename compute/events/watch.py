"""GET /api/compute/events/watch?types=node.*,reservation.*&since=N: a live event stream.

One JSON line per event, in sequence order, after `since`; authenticated like the envelope
(Bearer token) and decided once by IAM (`events.watch`). New events arrive through Postgres
LISTEN/NOTIFY (each outbox write notifies at commit), so a watcher waits without polling and
sees an event within a second; a quiet stream sends a blank keep-alive line every 15 s.
Resuming with the last sequence seen (`since`) skips nothing and repeats nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import close_old_connections

from bcd.contract import ids
from compute import iam
from compute.api.auth import principal_for_token
from compute.errors import ComputeError, InvalidArgument, PermissionDenied, Unauthenticated
from compute.events.selectors import event_list
from compute.events.serializers import present_event
from compute.iam import Resource
from compute.tenancy.selectors import tenant_resolve

CHANNEL = "bc_events"
KEEPALIVE_SECONDS = 15
PAGE = 500


def _authorize(headers: dict[str, str], query: dict[str, str]) -> tuple[Any, int, str]:
    """(tenant, since, types) for this watcher, or a ComputeError."""
    close_old_connections()
    scheme, _, credential = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credential:
        raise Unauthenticated("missing credentials: send Authorization: Bearer biam_…")
    principal = principal_for_token(credential.strip())
    tenant = tenant_resolve(query.get("tenantId") or None, principal=principal)
    try:
        since = int(query.get("since") or 0)
    except ValueError:
        raise InvalidArgument("since: must be an event sequence number",
                              field="since") from None
    decision = iam.decide(principal, "events.watch",
                          Resource(kind="events", tenant_id=tenant.id),
                          {"requestId": ids.new("req"), "tenantId": tenant.id})
    if not decision.allowed:
        raise PermissionDenied(f"not allowed: {decision.reason}", decisionId=decision.id)
    return tenant, max(0, since), query.get("types", "")


def _page(tenant: Any, types: str, since: int) -> list[dict[str, Any]]:
    close_old_connections()
    return [present_event(e) for e in event_list(tenant=tenant, types=types, since=since,
                                                 limit=PAGE)]


def _conninfo() -> str:
    db = settings.DATABASES["default"]
    parts = {"dbname": db["NAME"], "user": db["USER"], "password": db["PASSWORD"],
             "host": db["HOST"], "port": db["PORT"]}
    return " ".join(f"{k}='{v}'" for k, v in parts.items() if v)


async def events_watch(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI app (mounted by compute.asgi through Channels' router)."""
    headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
    query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
    try:
        tenant, since, types = await sync_to_async(_authorize, thread_sensitive=False)(
            headers, query)
    except ComputeError as error:
        body = json.dumps({"ok": False, "error": {"code": error.code, "message": error.message,
                                                  "details": error.details}}).encode()
        await send({"type": "http.response.start", "status": error.http_status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/x-ndjson"),
                            (b"cache-control", b"no-store")]})
    stream = asyncio.create_task(_stream(send, tenant, types, since))
    while True:  # the client hanging up ends the stream
        message = await receive()
        if message["type"] == "http.disconnect":
            stream.cancel()
            return


async def _stream(send: Any, tenant: Any, types: str, since: int) -> None:
    async with await psycopg.AsyncConnection.connect(_conninfo(), autocommit=True) as listener:
        await listener.execute(f"LISTEN {CHANNEL}")
        notifications = listener.notifies()
        while True:
            events = await sync_to_async(_page, thread_sensitive=False)(tenant, types, since)
            for event in events:
                await send({"type": "http.response.body", "more_body": True,
                            "body": json.dumps(event, cls=DjangoJSONEncoder).encode() + b"\n"})
                since = event["seq"]
            if len(events) == PAGE:
                continue
            try:
                async with asyncio.timeout(KEEPALIVE_SECONDS):
                    while True:
                        note = await anext(notifications)
                        if note.payload == tenant.id:
                            break
            except TimeoutError:
                await send({"type": "http.response.body", "body": b"\n", "more_body": True})
