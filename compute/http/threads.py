"""Django's ASGI handler with its synchronous views run on a fixed set of threads.

Django's own handler gives every request a new thread, and so a new Postgres connection (a
connection belongs to its thread): about 20 ms per call of connecting and authenticating.
Here each process keeps `threads` threads, each with its own persistent connection, and a
request borrows one for its whole life (middleware, view, response), as a WSGI thread would.
A request waits for a free thread when all are busy; event streams are asynchronous and
borrow none.

Threads are shared fairly between tenants (compute.http.fair). A request's body is read
whole before it borrows a thread, within a deadline that asks for
a minimum rate (`body_deadline`): a client that trickles its body holds no thread that
others need, and is answered 408 when it falls behind; one that announces more than the
largest body is answered 413 before anything is read.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from compute.core.errors import ComputeError, PayloadTooLarge, RequestTimeout
from compute.http.edge import new_request_id, send_error
from compute.http.fair import FairSlots, request_key


class ThreadPoolHandler(ASGIHandler):
    def __init__(self, threads: int) -> None:
        super().__init__()
        # Every middleware and view here is synchronous: the whole chain runs in one call on
        # the borrowed thread, not in three hops through the event loop (middleware, then
        # Django's async core, then the view).
        self.load_middleware(is_async=False)
        self._threads = FairSlots([ThreadPoolExecutor(max_workers=1,
                                                      thread_name_prefix=f"api-{n}")
                                   for n in range(threads)],
                                  limit=settings.BC_TENANT_CALLS_IN_FLIGHT)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django serves HTTP, not {scope['type']}")
        try:
            body = await read_body(scope, receive)
            key = request_key(scope)
            executor = await self._threads.acquire(key)
        except ComputeError as refusal:  # before Django saw it: the connection ends after
            await send_error(send, refusal, new_request_id(), close=True)
            return
        except ClientGone:
            return
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, replayed(body, receive), send)
        finally:
            self._threads.release(key, executor)


BODY_SECONDS = 10.0  # a body's deadline: this long, and 1 s more per MIN_BODY_RATE bytes
MIN_BODY_RATE = 64 * 1024  # bytes per second


class ClientGone(Exception):
    """The client disconnected before its body was whole."""


def body_deadline(length: int) -> float:
    """Seconds a body of `length` bytes may take to arrive."""
    return BODY_SECONDS + length / MIN_BODY_RATE


async def read_body(scope: dict[str, Any], receive: Any) -> bytes:
    """The whole body, or PayloadTooLarge (announced or sent beyond the largest), or
    RequestTimeout (not whole within its deadline)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    announced = next((value for name, value in scope.get("headers", [])
                      if name == b"content-length"), b"")
    if announced.isdigit() and int(announced) > limit:
        raise PayloadTooLarge(f"the body is larger than {limit} bytes", limit=limit)
    deadline = body_deadline(int(announced) if announced.isdigit() else limit)
    chunks: list[bytes] = []
    size = 0

    async def whole() -> None:
        nonlocal size
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"the body is larger than {limit} bytes", limit=limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return

    try:
        await asyncio.wait_for(whole(), deadline)
    except TimeoutError:
        raise RequestTimeout(f"the body did not arrive within {deadline:.0f} s (it must come at "
                             f"{MIN_BODY_RATE // 1024} KiB/s or faster)",
                             seconds=round(deadline, 1)) from None
    return b"".join(chunks)


def replayed(body: bytes, receive: Any) -> Any:
    """A `receive` that gives the body read ahead as one message, then the client's own
    messages (its disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return receive_again
