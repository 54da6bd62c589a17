"""The events hub keeps one listener, on the event loop it serves: one left on another loop
is cancelled, since its connection, never read again, would block its backend once the
notifications filled the socket."""

from __future__ import annotations

import asyncio
import threading

from compute.http.hub import Hub


class Quiet(Hub):
    async def _listen(self) -> None:  # a listener that holds on, without a database
        await asyncio.Event().wait()


def test_a_listener_left_on_another_loop_is_cancelled():
    hub = Quiet()
    first = asyncio.new_event_loop()
    thread = threading.Thread(target=first.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(_subscribe(hub), first).result(5)
        left = hub.listener
        assert left is not None
        assert not left.done()

        asyncio.run(_subscribe(hub))  # another loop, as a new server thread would have

        assert asyncio.run_coroutine_threadsafe(_finished(left), first).result(5)
        assert left.cancelled()
    finally:
        first.call_soon_threadsafe(first.stop)
        thread.join(5)
        first.close()


async def _subscribe(hub: Hub) -> None:
    with hub.subscription(tenant_id="tnt_1"):
        await asyncio.sleep(0)


async def _finished(task: asyncio.Task[None]) -> bool:
    for _ in range(100):
        if task.done():
            return True
        await asyncio.sleep(0.01)
    return False
