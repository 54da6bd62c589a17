"""The envelope over HTTP: one POST per call, the envelope's error raised as ApiError, and
retries where they are safe (reads, and writes that carry an idempotency key)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx

from compute.core.envelope import ApiError, ClientError, envelope_result

__all__ = ["ApiError", "ClientError", "Transport"]

USER_AGENT = "better-compute-client"
RETRY_STATUSES = frozenset({502, 503, 504})


class Transport:
    def __init__(self, url: str, token: str, *, tenant: str | None = None,
                 timeout: float = 30.0, retries: int = 3, user_agent: str = USER_AGENT) -> None:
        self.url = url.rstrip("/")
        if not self.url.endswith("/api/compute"):
            self.url += "/api/compute"
        self.tenant = tenant
        self.retries = retries
        # Over plain HTTP there is no certificate to verify, and no CA bundle to load.
        self.http = httpx.Client(timeout=timeout, verify=not self.url.startswith("http://"),
                                 headers={"Authorization": f"Bearer {token}",
                                          "User-Agent": user_agent})

    def call(self, method: str, body: dict[str, Any] | None = None, *,
             retry: bool = False, timeout: float | None = None) -> Any:
        """POST the envelope of `method` (group.method) and return its result. With `retry`
        (a read, or a write with an idempotency key), a lost connection or a 502/503/504 is
        tried again with backoff."""
        group, _, name = method.partition(".")
        payload = {k: v for k, v in (body or {}).items() if v is not None}
        if self.tenant and "tenantId" not in payload:
            payload["tenantId"] = self.tenant
        url = f"{self.url}/{group}/{name}"
        for attempt in range(self.retries if retry else 1):
            if attempt:
                time.sleep(0.2 * 2 ** attempt)
            try:
                response = self.http.post(url, json=payload, timeout=(
                    timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT))
            except httpx.TransportError as error:
                failure: Exception = ClientError(f"cannot reach {self.url}: {error}")
                continue
            if response.status_code in RETRY_STATUSES and retry:
                failure = ClientError(f"{url} answered HTTP {response.status_code}")
                continue
            return self._result(url, response)
        raise failure

    @staticmethod
    def _result(url: str, response: httpx.Response) -> Any:
        return envelope_result(url, response.status_code, response.content)

    def watch(self, *, types: str = "", since: int = 0) -> Iterator[dict[str, Any]]:
        """Events as they happen, after sequence `since`; a dropped stream is resumed from
        the last event seen, so nothing is skipped or repeated. Stop by leaving the loop."""
        while True:
            params = {"since": str(since), **({"types": types} if types else {}),
                      **({"tenantId": self.tenant} if self.tenant else {})}
            try:
                with self.http.stream("GET", f"{self.url}/events/watch", params=params,
                                      timeout=httpx.Timeout(30.0, read=60.0)) as response:
                    if response.status_code != 200:
                        self._result(f"{self.url}/events/watch",
                                     httpx.Response(response.status_code,
                                                    content=response.read()))
                    for line in response.iter_lines():
                        if line.strip():
                            event = json.loads(line)
                            since = event["seq"]
                            yield event
            except httpx.TransportError:
                time.sleep(1.0)  # cut: resume from `since`

    def close(self) -> None:
        self.http.close()
