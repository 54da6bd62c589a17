"""Wake the gateway when a commit changes what some node should hold or run.

One LISTEN connection per gateway process; it sets an asyncio.Event at every NOTIFY on the
channel, and once after each (re)connection, since a notification sent while it was away is
lost (the gateway's timed pass still runs, so nothing waits longer than that)."""

from __future__ import annotations

import asyncio
import logging

import psycopg

from compute.db import conninfo

logger = logging.getLogger("gateway")


async def listen_for(channel: str, woken: asyncio.Event) -> None:
    delay = 0.5
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(conninfo(),
                                                             autocommit=True) as conn:
                await conn.execute(f"LISTEN {channel}")
                delay = 0.5
                woken.set()
                async for _ in conn.notifies():
                    woken.set()
        except (psycopg.Error, OSError) as error:
            logger.warning("gateway: listening on %s failed (%s); again in %.1fs", channel,
                           error, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 10.0)
