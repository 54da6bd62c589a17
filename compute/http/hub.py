"""One LISTEN connection per process, fanned out to every events watcher in it.

A watcher subscribes for its tenant and waits on its own asyncio.Event; the hub's one
connection to Postgres sets the events of a tenant's watchers when a commit in that tenant
notifies. If the connection drops, the hub reconnects with backoff and wakes every watcher,
which re-reads from its cursor, so nothing is lost. Watchers are counted per process here
(past the limit a new stream is refused, 429), and per caller and per tenant across every
process by their leases (compute.platform.iam.streams), so no one can take every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from compute.core.db import listen_forever
from compute.core.errors import TooManyRequests

CHANNEL = "bc_events"


@dataclass
class Hub:
    per_process: int = 256
    waiters: dict[str, set[asyncio.Event]] = field(default_factory=lambda: defaultdict(set))
    streams: int = 0
    listener: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def subscription(self, *, tenant_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever the tenant's events may have changed (or the hub
        reconnected); refuses past the process's limit."""
        if self.streams >= self.per_process:
            raise TooManyRequests("this server has as many event streams as it takes; "
                                  "retry later or on another server", limit=self.per_process,
                                  retryAfterSeconds=5)
        self._ensure_listening()
        woken = asyncio.Event()
        self.streams += 1
        self.waiters[tenant_id].add(woken)
        try:
            yield woken
        finally:
            self.waiters[tenant_id].discard(woken)
            self.streams -= 1

    def _ensure_listening(self) -> None:
        loop = asyncio.get_running_loop()
        if self.listener is None or self.listener.done() or self.listener.get_loop() is not loop:
            self._stop_listening()
            self.listener = loop.create_task(self._listen())

    def _stop_listening(self) -> None:
        """Cancel a listener left on another event loop: its connection, never read again,
        would block its backend once notifications filled the socket."""
        if self.listener is None or self.listener.done():
            return
        other = self.listener.get_loop()
        if not other.is_closed():
            other.call_soon_threadsafe(self.listener.cancel)

    def _wake(self, tenant_id: str | None = None) -> None:
        groups = [self.waiters.get(tenant_id, set())] if tenant_id else self.waiters.values()
        for group in groups:
            for event in group:
                event.set()

    async def _listen(self) -> None:
        await listen_forever(CHANNEL, self._wake)


HUB = Hub()
