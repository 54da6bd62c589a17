"""GET /api/compute/events/watch?types=node.*,reservation.*&since=N: a live event stream.

One JSON line per event, in sequence order, after `since`; authenticated and decided once
by IAM (`events.watch`) at the same edge as the envelope. New events arrive through
Postgres LISTEN/NOTIFY (each outbox write notifies at commit), so a watcher waits without
polling and sees an event within a second; a quiet stream sends a blank keep-alive line
every 15 s and keeps listening. Resuming with the last sequence seen (`since`) skips
nothing and repeats nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import parse_qs

import psycopg
from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import close_old_connections

from compute.api.registry import Resource
from compute.db import conninfo
from compute.errors import InvalidArgument
from compute.events.selectors import event_list
from compute.events.serializers import present_event
from compute.events.types import parse_type_globs
from compute.http.edge import caller, decide_once, error_answer, new_request_id
from compute.tenancy.models import Tenant

logger = logging.getLogger("compute.http")
CHANNEL = "bc_events"
KEEPALIVE_SECONDS = 15.0
PAGE = 500


def _authorize(headers: dict[str, str], query: dict[str, str],
               request_id: str) -> tuple[Tenant, int, str]:
    """(tenant, since, types) for this watcher, or a ComputeError."""
    close_old_connections()
    try:
        who = caller(headers, tenant_ref=query.get("tenantId"), request_id=request_id)
        try:
            since = int(query.get("since") or 0)
        except ValueError:
            raise InvalidArgument("since: must be an event sequence number",
                                  field="since") from None
        types = query.get("types", "")
        parse_type_globs(types)
        decide_once(who, "events.watch", Resource(kind="events", tenant_id=who.tenant.id))
        return who.tenant, max(0, since), types
    finally:
        close_old_connections()


def _page(tenant: Tenant, types: str, since: int) -> list[dict[str, Any]]:
    close_old_connections()
    try:
        return [present_event(e) for e in event_list(tenant=tenant, types=types, since=since,
                                                     limit=PAGE)]
    finally:
        close_old_connections()


async def events_watch(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI app (mounted by compute.asgi through Channels' router)."""
    request_id = new_request_id()
    headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
    query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
    try:
        tenant, since, types = await sync_to_async(_authorize, thread_sensitive=False)(
            headers, query, request_id)
    except Exception as error:
        status, body = error_answer(error, request_id)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body",
                    "body": json.dumps(body, cls=DjangoJSONEncoder).encode()})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/x-ndjson"),
                            (b"cache-control", b"no-store")]})
    stream = asyncio.create_task(_stream(send, tenant, types, since))
    hangup = asyncio.create_task(_hangup(receive))
    done, _ = await asyncio.wait({stream, hangup}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stream, hangup):
        task.cancel()
    if stream in done and not stream.cancelled() and stream.exception() is not None:
        logger.error("events watch %s ended", request_id, exc_info=stream.exception())
    if hangup not in done:  # the stream failed: end the response so the client reconnects
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _hangup(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _stream(send: Any, tenant: Tenant, types: str, since: int) -> None:
    async with await psycopg.AsyncConnection.connect(conninfo(), autocommit=True) as listener:
        await listener.execute(f"LISTEN {CHANNEL}")
        while True:
            events = await sync_to_async(_page, thread_sensitive=False)(tenant, types, since)
            for event in events:
                await send({"type": "http.response.body", "more_body": True,
                            "body": json.dumps(event, cls=DjangoJSONEncoder).encode() + b"\n"})
                since = event["seq"]
            if len(events) == PAGE:
                continue
            if not await _woken(listener, tenant.id):
                await send({"type": "http.response.body", "body": b"\n", "more_body": True})


async def _woken(listener: psycopg.AsyncConnection[Any], tenant_id: str) -> bool:
    """Wait for a commit in the tenant (True) or a quiet keep-alive period (False).

    Each wait reads notifications through a new generator that ends by itself at the
    timeout: cancelling one half-way through would close the connection's notification
    stream for good, which is how a watcher once fell silent after its first keep-alive.
    """
    async for note in listener.notifies(timeout=KEEPALIVE_SECONDS):
        if note.payload == tenant_id:
            return True
    return False
