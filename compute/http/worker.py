"""The API's worker process under gunicorn: uvicorn serving the ASGI application, with its
connections shared out evenly between the worker processes."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
from typing import Any, ClassVar

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

logger = logging.getLogger("compute.http")

SLOTS = 256  # worker processes the board has room for (`serve --workers` allows 128)
# Seconds a worker waits to accept, per connection it holds above the fewest: the head start
# of the least loaded, which on a busy machine may take more than a few ms to be woken.
STEP = 0.02
POST_EVERY = 0.05  # seconds between two posts of a worker's count (connections also end)
MAX_DELAY = 0.05  # so a stuck worker holding few delays a new connection at most this long
# Made when the master imports this module, before it forks: every worker of one master
# shares it. Per worker, (pid, connections held).
BOARD = multiprocessing.RawArray("q", 2 * SLOTS)
CLAIM = multiprocessing.Lock()


class Board:
    """This worker's slot on the shared board of connections held per worker."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        with CLAIM:
            self.slot = next((n for n in range(SLOTS) if not _alive(BOARD[2 * n])), -1)
            if self.slot >= 0:
                BOARD[2 * self.slot], BOARD[2 * self.slot + 1] = self.pid, 0

    def publish(self, held: int) -> None:
        if self.slot >= 0:
            BOARD[2 * self.slot + 1] = held

    def fewest_elsewhere(self) -> int | None:
        """The fewest connections another live worker holds, None when there is none."""
        counts = [BOARD[2 * n + 1] for n in range(SLOTS)
                  if n != self.slot and BOARD[2 * n] and _alive(BOARD[2 * n])]
        return min(counts, default=None)

    def leave(self) -> None:
        if self.slot >= 0:
            BOARD[2 * self.slot] = 0


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BalancedListener:
    """Accepts connections from a listening socket that every worker process shares, the
    least loaded worker first.

    Each worker keeps a connection for its whole life (HTTP keep-alive), and every worker is
    woken for each new one, so whichever wins the race keeps it: one worker ended up with
    12 of 32 connections and another with 3, and the first one's clients waited four times
    as long. Here each worker says on a shared board how many connections it holds, and
    waits STEP per connection it holds above the fewest another one holds (at most
    MAX_DELAY) before taking a new one; the least loaded takes it at once.
    """

    def __init__(self, sock: socket.socket, server: ApiServer, board: Board) -> None:
        self._sock, self._server, self._board = sock, server, board
        self._loop = asyncio.get_running_loop()
        self._accepting = 0  # accepted, not yet counted among the server's connections
        self._closed = False
        self._loop.add_reader(sock.fileno(), self._readable)
        self._keep_posted()

    def _keep_posted(self) -> None:
        """Say how many connections are held now, and again in POST_EVERY seconds."""
        if not self._closed:
            self._board.publish(self._held())
            self._loop.call_later(POST_EVERY, self._keep_posted)

    def _held(self) -> int:
        return len(self._server.server_state.connections) + self._accepting

    def _readable(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        held = self._held()
        self._board.publish(held)
        fewest = self._board.fewest_elsewhere()
        above = 0 if fewest is None else max(0, held - fewest)
        self._loop.call_later(min(MAX_DELAY, above * STEP), self._accept)

    def _accept(self) -> None:
        if self._closed:
            return
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            pass  # another worker took it
        except OSError as error:  # out of file descriptors, say: the others may take it
            logger.warning("could not accept a connection: %s", error)
        else:
            conn.setblocking(False)
            self._accepting += 1
            self._board.publish(self._held())
            self._loop.create_task(self._serve(conn))
        self._loop.add_reader(self._sock.fileno(), self._readable)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._server.new_protocol, conn)
        except OSError:
            conn.close()
        finally:
            self._accepting -= 1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._sock.fileno())
            self._board.leave()

    async def wait_closed(self) -> None:
        return None


class ApiServer(Server):
    """uvicorn's server, listening on the master's sockets through BalancedListener."""

    def new_protocol(self) -> asyncio.Protocol:
        config = self.config
        return config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=self.server_state, app_state=self.lifespan.state)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # the lifespan, and no listener of its own
        if self.started:
            board = Board()
            self.servers = [BalancedListener(sock, self, board)  # type: ignore[misc]
                            for sock in sockets or []]


class ApiWorker(UvicornWorker):
    """A uvicorn worker that shares connections evenly with the other workers, and stops
    when its master is gone (killed with -9): an orphan would keep accepting on the
    inherited socket while a new master cannot bind it."""

    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "loop": "auto", "http": "auto",
        "timeout_notify": 2,  # how often the master's liveness is checked, in seconds
    }

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        server = ApiServer(config=self.config)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            raise SystemExit(Arbiter.WORKER_BOOT_ERROR)

    async def callback_notify(self) -> None:
        if os.getppid() != self.ppid:
            self.log.warning("the API's master process is gone: worker %s stops", self.pid)
            os.kill(os.getpid(), signal.SIGTERM)  # uvicorn drains its connections and exits
        self.notify()
