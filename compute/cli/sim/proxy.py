"""A fault-injecting TCP proxy: the network between one simulated machine and the gateway.

Each `Link` listens on a port of its own and forwards to the gateway. Its mode is what the
network does now: `pass`; `drop` (bytes are read and thrown away: a black hole that keeps
connections open); `freeze` (nothing is read: the peers' buffers fill and they stall);
`delay` (each chunk waits `delay` seconds); `reset` (open connections are reset, new ones
are reset on arrival). Every link runs on one asyncio loop in a thread of its own.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from dataclasses import dataclass, field

MODES = ("pass", "drop", "freeze", "delay", "reset")
CHUNK = 65536


@dataclass
class Link:
    target: tuple[str, int]
    port: int = 0
    mode: str = "pass"
    delay: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    server: asyncio.AbstractServer | None = None

    async def serve(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        self.writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                self.writers.discard(end)
                end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                while self.mode == "freeze":
                    self.changed.clear()
                    await self.changed.wait()
                data = await reader.read(CHUNK)
                if not data:
                    writer.write_eof()
                    return
                if self.mode == "drop":
                    continue
                if self.mode == "delay":
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except (OSError, RuntimeError):  # the other end was reset or closed
            writer.close()

    def set(self, mode: str, delay: float = 0.0) -> None:
        self.mode, self.delay = mode, delay
        self.changed.set()
        if mode == "reset":
            for writer in list(self.writers):
                _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (linger 0), as a middlebox that drops the connection does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Network:
    """The links of every simulated machine, on one event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.links: dict[str, Link] = {}
        threading.Thread(target=self.loop.run_forever, daemon=True, name="sim-net").start()

    def link(self, name: str, target: tuple[str, int]) -> Link:
        """A new link called `name` to `target`, listening on a free port of 127.0.0.1."""
        async def make() -> Link:
            link = Link(target)
            await link.serve()
            return link

        link = asyncio.run_coroutine_threadsafe(make(), self.loop).result(10)
        self.links[name] = link
        return link

    def set(self, name: str, mode: str, delay: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.loop.call_soon_threadsafe(self.links[name].set, mode, delay)

    def heal(self) -> None:
        for name in self.links:
            self.set(name, "pass")

    def close(self) -> None:
        async def shut() -> None:
            for link in self.links.values():
                if link.server is not None:
                    link.server.close()
        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
