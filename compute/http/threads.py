"""Django's ASGI handler with its synchronous views run on a fixed set of threads.

Django's own handler gives every request a new thread, and so a new Postgres connection (a
connection belongs to its thread): about 20 ms per call of connecting and authenticating.
Here each process keeps `threads` threads, each with its own persistent connection, and a
request borrows one for its whole life (middleware, view, response), as a WSGI thread would.
A request waits for a free thread when all are busy; event streams are asynchronous and
borrow none.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest
from django.http.response import HttpResponseBase


class ThreadPoolHandler(ASGIHandler):
    def __init__(self, threads: int) -> None:
        super().__init__()
        # Every middleware and view here is synchronous: the whole chain runs in one call on
        # the borrowed thread, not in three hops through the event loop (middleware, then
        # Django's async core, then the view).
        self.load_middleware(is_async=False)
        self._executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"api-{n}")
                           for n in range(threads)]
        self._free: asyncio.Queue[ThreadPoolExecutor] | None = None

    def _free_threads(self) -> asyncio.Queue[ThreadPoolExecutor]:
        if self._free is None:  # made inside the server's event loop
            self._free = asyncio.Queue()
            for executor in self._executors:
                self._free.put_nowait(executor)
        return self._free

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django serves HTTP, not {scope['type']}")
        free = self._free_threads()
        executor = await free.get()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            free.put_nowait(executor)
