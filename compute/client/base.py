"""What every generated group of methods shares: the transport it calls through."""

from __future__ import annotations

from typing import Any

from compute.client.transport import Transport


class Group:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def _call(self, method: str, body: dict[str, Any], *, retry: bool) -> Any:
        return self._transport.call(method, body, retry=retry)
