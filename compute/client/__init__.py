"""The better-compute Python client: one typed method per API method.

    from compute.client import Client

    client = Client("https://compute.example.com", token)   # or Client.from_env()
    rsv = client.reservations.create(pool_id=pool, duration=3_600_000,
                                     devices=[{"class": "gpu", "count": 4}],
                                     idempotency_key="train-42")
    for event in client.events.watch(types="reservation.*", since=0): ...

Errors of the envelope arrive as ApiError (code, message, details, request_id); reads, and
writes that carry an idempotency key, are retried when the connection drops.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from compute.client.methods import GROUPS, Events
from compute.client.sandbox import Sandbox
from compute.client.transport import ApiError, ClientError, Transport
from compute.core import config

__all__ = ["ApiError", "Client", "ClientError"]


class WatchableEvents(Events):
    def watch(self, *, types: str = "", since: int = 0) -> Iterator[dict[str, Any]]:
        """Follow the event stream (resumed after a cut, nothing skipped or repeated)."""
        return self._transport.watch(types=types, since=since)


class Client:
    """`Client(url, token, tenant=None)`: each API group is an attribute (client.pools,
    client.reservations, …) with one method per API method."""

    def __init__(self, url: str, token: str, *, tenant: str | None = None,
                 timeout: float = 30.0) -> None:
        self.transport = Transport(url, token, tenant=tenant, timeout=timeout)
        for name, group in GROUPS.items():
            setattr(self, name, (WatchableEvents if name == "events" else group)(
                self.transport))

    @classmethod
    def from_env(cls) -> Client:
        """From BETTER_COMPUTE_URL, BETTER_COMPUTE_TOKEN and BETTER_COMPUTE_TENANT."""
        url, token = config.text("BETTER_COMPUTE_URL"), config.text("BETTER_COMPUTE_TOKEN")
        if not url or not token:
            raise ValueError("set BETTER_COMPUTE_URL and BETTER_COMPUTE_TOKEN")
        return cls(url, token, tenant=config.text("BETTER_COMPUTE_TENANT") or None)

    def call(self, method: str, **body: Any) -> Any:
        """Any API method by name with its wire-form fields (for new methods)."""
        return self.transport.call(method, body)

    def sandbox(self, *, pool: str, vcpus: int = 1, memory_gib: int = 1,
                image: str | None = None, network: str | None = None) -> Sandbox:
        """A sandbox for a `with` block: created and booted on entry, released on exit."""
        return Sandbox(self.transport, pool=pool, vcpus=vcpus, memory_gib=memory_gib,
                       image=image, network=network)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
