"""The CLI's envelope calls over the standard library's HTTP client. Loading httpx (and the
async libraries it looks for) would cost every command that calls the API a hundred
milliseconds or more before its first byte; only `events watch`, which streams, uses it."""

from __future__ import annotations

import http.client
import json
import select
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit

from compute.core.envelope import ClientError, envelope_result


class Wire:
    """POSTs envelopes to `url` (…/api/compute) on one connection per thread (an
    http.client connection is not safe to share), kept between the calls of a command and
    opened again when the server has closed it meanwhile."""

    def __init__(self, url: str, token: str, *, timeout: float, user_agent: str) -> None:
        parts = urlsplit(url)
        self.url = url.rstrip("/")
        self.path = parts.path.rstrip("/")
        self.host, self.port = parts.hostname or "", parts.port
        self.https = parts.scheme == "https"
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": user_agent,
                        "Content-Type": "application/json", "Accept": "application/json"}
        self._local = threading.local()

    @property
    def connection(self) -> http.client.HTTPConnection | None:
        return getattr(self._local, "connection", None)

    @connection.setter
    def connection(self, connection: http.client.HTTPConnection | None) -> None:
        self._local.connection = connection

    def call(self, method: str, payload: dict[str, Any]) -> Any:
        group, _, name = method.partition(".")
        path = f"{self.path}/{group}/{name}"
        try:
            connection = self._connection()
            connection.request("POST", path, body=json.dumps(payload).encode(),
                               headers=self.headers)
            response = connection.getresponse()
            status, body = response.status, response.read()
        except (OSError, http.client.HTTPException) as error:
            self.close()
            raise ClientError(f"cannot reach {self.url}: {error}") from None
        if response.will_close:
            self.close()
        return envelope_result(f"{self.url}/{group}/{name}", status, body)

    def _connection(self) -> http.client.HTTPConnection:
        """The kept connection, unless the server closed it while idle (it is readable then:
        at its end), in which case a new one; a request is never sent twice."""
        if self.connection is not None and self.connection.sock is not None:
            readable, _, _ = select.select([self.connection.sock], [], [], 0)
            if readable:
                self.close()
        if self.connection is None:
            self.connection = (
                http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                            context=ssl.create_default_context())
                if self.https else
                http.client.HTTPConnection(self.host, self.port, timeout=self.timeout))
        return self.connection

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None
