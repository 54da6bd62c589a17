"""The API's threads shared fairly between tenants.

Each process has a few threads (compute.http.threads); a request waits for one. Waiting in
arrival order let one tenant's burst stand in front of everyone else's calls. Here a free
thread goes to the waiting tenant with the fewest calls running, so another tenant's call
waits for at most the calls already running, and a tenant may have at most `limit` calls in
flight (running or waiting) in one process: past it, 429 with Retry-After.

A request's tenant is known before its thread only by what it carries: a bearer token's
public id, mapped to its principal's tenant once the token has authenticated in this
process (`learn`); until then, and for sessions and anonymous calls, the token, the session
or the client address counts as a tenant of its own. The map only orders waiting; every call
is still authenticated and decided on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter, OrderedDict, deque
from typing import Any, Generic, TypeVar

from django.conf import settings

from compute.core.errors import TooManyRequests

Slot = TypeVar("Slot")
LEARNED: OrderedDict[str, str] = OrderedDict()  # token id -> tenant id, newest last
LEARNED_MAX = 50_000


def learn(credential: str, tenant_id: str) -> None:
    """Remember the tenant of a token that just authenticated (by its public id only)."""
    token_id = credential.partition(".")[0]
    LEARNED[token_id] = tenant_id
    LEARNED.move_to_end(token_id)
    while len(LEARNED) > LEARNED_MAX:
        LEARNED.popitem(last=False)


def request_key(scope: dict[str, Any]) -> str:
    """Whom a request counts against: its tenant when known, else its credential or address."""
    headers = dict(scope.get("headers") or [])
    authorization = headers.get(b"authorization", b"").decode("latin-1")
    if authorization[:7].lower() == "bearer ":
        token_id = authorization[7:].strip().partition(".")[0][:64]
        return LEARNED.get(token_id) or f"token:{token_id}"
    cookies = headers.get(b"cookie", b"")
    name = settings.SESSION_COOKIE_NAME.encode() + b"="
    if name in cookies:
        session = cookies.split(name, 1)[1].split(b";", 1)[0]
        return "session:" + hashlib.sha256(session).hexdigest()[:16]
    client = scope.get("client") or ("", 0)
    return f"address:{client[0]}"


class FairSlots(Generic[Slot]):
    """Slots (threads) handed to waiting keys, the one with the fewest running first."""

    def __init__(self, slots: list[Slot], *, limit: int) -> None:
        self.free = list(slots)
        self.limit = limit
        self.running: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.waiting: dict[str, deque[asyncio.Future[Slot]]] = {}

    async def acquire(self, key: str) -> Slot:
        if self.in_flight[key] >= self.limit:
            raise TooManyRequests(f"at most {self.limit} calls of one tenant in flight on "
                                  "one server; try again shortly", limit=self.limit,
                                  retryAfterSeconds=1)
        self.in_flight[key] += 1
        if self.free and not self.waiting:
            self.running[key] += 1
            return self.free.pop()
        turn: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(key, deque()).append(turn)
        try:
            return await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # handed over as it was cancelled
                self.release(key, turn.result())
            else:
                self._forget(key, turn)
                self.in_flight[key] -= 1
            raise

    def release(self, key: str, slot: Slot) -> None:
        self.running[key] -= 1
        self.in_flight[key] -= 1
        if not self.waiting:
            self.free.append(slot)
            return
        # The fewest running first; on a tie another key before the one that just ran,
        # then the one waiting longest.
        nxt = min(self.waiting, key=lambda k: (self.running[k], k == key))
        turn = self.waiting[nxt].popleft()
        if not self.waiting[nxt]:
            del self.waiting[nxt]
        else:  # others of that key go behind keys that waited meanwhile
            self.waiting[nxt] = self.waiting.pop(nxt)
        self.running[nxt] += 1
        turn.set_result(slot)

    def _forget(self, key: str, turn: asyncio.Future[Slot]) -> None:
        queue = self.waiting.get(key)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self.waiting[key]
