"""A webhook receiver: a real HTTP server on loopback, in a thread of the test's process."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Receiver:
    """Answers `status` (200 unless told otherwise) and keeps what it accepted."""

    status: int = 200
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    def messages(self) -> list[dict]:
        return [json.loads(body) for _, body in self.received]


@contextmanager
def receiving() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if state.status == 200:
                state.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(state.status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
