"""What a provisioner hands a machine's deploy ramdisk: the OS image to write and how its
agent joins (the control plane's address and pins, and the deploy's single-use token).

A deploy command leaves them here for the one machine it deploys; the ramdisk asks for them
over HTTP on the management network (`bcd node --provisioner --deploy-listen HOST:PORT`),
naming its own serial and product UUID, and gets them once. The token is bound to that
identity at the control plane too, so a copy taken by another machine cannot join.

When the image is written, the ramdisk says so (`POST /v1/deploy/written` with the deploy's
key from its instructions) and powers the machine off; the provisioner then finishes the
deploy through the BMC: next boot from the disk, media ejected, power on.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bcd.contract.bmc import same_uuid

logger = logging.getLogger("bcd.deploys")
PATH = "/v1/deploy"


class Deploys:
    """The instructions waiting for each machine being deployed, until taken or expired,
    and how to finish each deploy once its image is written."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, dict[str, Any]] = {}  # by target node id
        self._finishing: dict[str, tuple[str, Callable[[], None], float]] = {}

    def offer(self, target: str, instructions: dict[str, Any], *, expires_at: float,
              finish: Callable[[], None]) -> None:
        key = secrets.token_urlsafe(24)
        with self._lock:
            self._waiting[target] = {**instructions, "deployKey": key,
                                     "_expiresAt": expires_at}
            self._finishing[target] = (key, finish, expires_at)

    def withdraw(self, target: str) -> None:
        with self._lock:
            self._waiting.pop(target, None)
            self._finishing.pop(target, None)

    def take(self, *, serial: str, product_uuid: str) -> dict[str, Any] | None:
        """The instructions for the machine with this identity, once."""
        with self._lock:
            for target, waiting in list(self._waiting.items()):
                if waiting["_expiresAt"] < time.time():
                    del self._waiting[target]
                elif same_uuid(waiting["productUuid"], product_uuid) and (
                        not waiting["serial"] or waiting["serial"] == serial):
                    del self._waiting[target]
                    return {k: v for k, v in waiting.items() if not k.startswith("_")}
        return None

    def written(self, *, target: str, key: str) -> bool:
        """The ramdisk of `target` wrote its image: finish its deploy (once, on a thread)."""
        with self._lock:
            known, finish, expires_at = self._finishing.get(target, ("", None, 0.0))
            if finish is None or expires_at < time.time() or not hmac.compare_digest(
                    known.encode(), key.encode()):
                return False
            del self._finishing[target]
        threading.Thread(target=finish, name=f"bcd-deploy-{target}", daemon=True).start()
        return True


def serve_deploys(deploys: Deploys, listen: str) -> ThreadingHTTPServer:
    """Serve `GET /v1/deploy?serial=S&productUuid=U` and `POST /v1/deploy/written?target=
    NODE&key=K` on `listen` (HOST:PORT), on a thread."""
    host, _, port = listen.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            found = deploys.take(serial=query.get("serial", ""),
                                 product_uuid=query.get("productUuid", "")) \
                if url.path == PATH else None
            self._answer(found, "no deploy waits for this machine")
            if found:
                logger.info("deploy instructions taken by %s", found.get("target"))

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            done = url.path == f"{PATH}/written" and deploys.written(
                target=query.get("target", ""), key=query.get("key", ""))
            self._answer({"finishing": True} if done else None,
                         "no deploy of this machine waits to be finished with this key")
            if done:
                logger.info("%s: image written; finishing its deploy", query.get("target"))

        def _answer(self, found: dict[str, Any] | None, missing: str) -> None:
            body = json.dumps(found or {"error": missing}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("deploy lookup: " + format, *args)

    server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)  # noqa: S104
    threading.Thread(target=server.serve_forever, name="bcd-deploys", daemon=True).start()
    return server
