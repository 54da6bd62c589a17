"""GET /api/compute/events/watch?types=node.*,reservation.*&since=N: a live event stream.

One JSON line per event, in sequence order, after `since`; authenticated and decided once
by IAM (`events.watch`) at the same edge as the envelope. New events arrive through
Postgres LISTEN/NOTIFY (each outbox write notifies at commit; one listening connection per
process, compute.http.hub), so a watcher waits without polling and sees an event within a
second. A stream ends when its token is revoked or expires; a quiet one sends a blank
keep-alive line every 15 s and keeps listening. Without `since` the stream starts at the
newest event (what happens from now on); `since=0` replays the history. Resuming with the
last sequence seen (`since`) skips nothing and repeats nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import close_old_connections

from compute.core.api.registry import Resource
from compute.core.errors import InvalidArgument, Unauthenticated
from compute.http.auth import session_principal
from compute.http.edge import caller, decide_once, new_request_id, send_error
from compute.http.hub import HUB
from compute.platform.events.presenters import present_event
from compute.platform.events.selectors import event_head, event_list
from compute.platform.events.types import parse_type_globs
from compute.platform.iam.streams import stream_lease_drop, stream_lease_renew, stream_lease_take
from compute.platform.tenancy.models import Tenant
from compute.platform.tenancy.selectors import principal_for_token

logger = logging.getLogger("compute.http")
KEEPALIVE_SECONDS = 15.0
PAGE = 500


@dataclass(frozen=True)
class Watch:
    tenant: Tenant
    principal_id: str
    recheck: Callable[[], object]  # raises Unauthenticated once the caller's standing ends
    since: int
    types: str
    lease_id: int  # its lease among the caller's and the tenant's streams


def _authorize(headers: dict[str, str], query: dict[str, str], request_id: str,
               scope: dict[str, Any]) -> Watch:
    """What this watcher may see, or a ComputeError. A browser watches with its console
    session (and the CSRF header), anything else with a bearer token."""
    close_old_connections()
    try:
        session, user = scope.get("session"), scope.get("user")
        who = caller(headers, tenant_ref=query.get("tenantId"), request_id=request_id,
                     action="events.watch", session=session, user=user,
                     address=(scope.get("client") or ("",))[0] or "")
        try:
            since = int(query["since"]) if query.get("since") else None
        except ValueError:
            raise InvalidArgument("since: must be an event sequence number",
                                  field="since") from None
        types = query.get("types", "")
        parse_type_globs(types)
        decide_once(who, "events.watch", Resource(kind="events", tenant_id=who.tenant.id))
        credential = headers.get("authorization", "").partition(" ")[2].strip()
        recheck: Callable[[], object] = (
            functools.partial(principal_for_token, credential) if credential
            else functools.partial(session_principal, session, user))
        lease_id = stream_lease_take(principal_id=who.principal.id, tenant_id=who.tenant.id)
        start = event_head(tenant=who.tenant) if since is None else max(0, since)
        return Watch(who.tenant, who.principal.id, recheck, start, types, lease_id)
    finally:
        close_old_connections()


def _lease_dropped(watch: Watch) -> None:
    close_old_connections()
    try:
        stream_lease_drop(watch.lease_id)
    finally:
        close_old_connections()


def _still_allowed(watch: Watch) -> bool:
    """A stream lives only as long as its token or session: revoked or expired, it ends."""
    close_old_connections()
    try:
        watch.recheck()
        stream_lease_renew(watch.lease_id)
        return True
    except Unauthenticated:
        return False
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
    """The ASGI app (mounted by compute.project.asgi through Channels' router)."""
    request_id = new_request_id()
    headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
    query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
    watch: Watch | None = None
    with contextlib.ExitStack() as held:
        try:
            watch = await sync_to_async(_authorize, thread_sensitive=False)(
                headers, query, request_id, scope)
            woken = held.enter_context(HUB.subscription(tenant_id=watch.tenant.id))
        except Exception as error:
            if watch is not None:
                await sync_to_async(_lease_dropped, thread_sensitive=False)(watch)
            await send_error(send, error, request_id)
            return
        try:
            await _serve(send, receive, watch, woken, request_id)
        finally:
            await asyncio.shield(sync_to_async(_lease_dropped, thread_sensitive=False)(watch))


async def _serve(send: Any, receive: Any, watch: Watch, woken: asyncio.Event,
                 request_id: str) -> None:
    """Stream to the watcher until it hangs up or its standing ends."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/x-ndjson"),
                            (b"cache-control", b"no-store")]})
    # A keep-alive line at once: the server sends the headers with the first bytes, and
    # a watcher learns that it is connected without waiting for an event.
    await send({"type": "http.response.body", "body": b"\n", "more_body": True})
    stream = asyncio.create_task(_stream(send, watch, woken))
    hangup = asyncio.create_task(_hangup(receive))
    done, _ = await asyncio.wait({stream, hangup}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stream, hangup):
        task.cancel()
    if stream in done and not stream.cancelled() and stream.exception() is not None:
        logger.error("events watch %s ended", request_id, exc_info=stream.exception())
    if hangup not in done:  # the stream ended: end the response (a client reconnects)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _hangup(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _stream(send: Any, watch: Watch, woken: asyncio.Event) -> None:
    """Page from the cursor, then wait for the hub's wake-up or a keep-alive period.

    The event is cleared before each page, so a commit that lands while paging wakes the
    next wait at once: nothing is missed between the read and the wait.
    """
    since = watch.since
    while await sync_to_async(_still_allowed, thread_sensitive=False)(watch):
        woken.clear()
        events = await sync_to_async(_page, thread_sensitive=False)(watch.tenant, watch.types,
                                                                    since)
        for event in events:
            await send({"type": "http.response.body", "more_body": True,
                        "body": json.dumps(event, cls=DjangoJSONEncoder).encode() + b"\n"})
            since = event["seq"]
        if len(events) == PAGE:
            continue
        try:
            async with asyncio.timeout(KEEPALIVE_SECONDS):
                await woken.wait()
        except TimeoutError:
            await send({"type": "http.response.body", "body": b"\n", "more_body": True})
