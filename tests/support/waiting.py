"""The one way tests wait for a condition: poll it until true or a deadline passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, *,
               interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


async def eventually(predicate: Callable[[], object], timeout: float = 30.0) -> bool:
    """The asynchronous twin. The predicate runs in a worker thread, so it may read the
    database (the thread's connection is closed after each look)."""

    def look() -> object:
        from django.db import connection

        try:
            return predicate()
        finally:
            connection.close()

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(look):
            return True
        await asyncio.sleep(0.05)
    return False
