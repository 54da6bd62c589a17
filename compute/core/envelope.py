"""The envelope's answer read from an HTTP status and body, with no HTTP library: what the
client library's transport and the CLI's share."""

from __future__ import annotations

import json
from typing import Any


class ClientError(Exception):
    """The API could not be reached, or answered something that is not an envelope."""


class ApiError(ClientError):
    """The envelope's error: `code` (such as capacity_conflict), `message`, `details` (such
    as the field it names), the HTTP `status` and the `request_id` to quote to an operator."""

    def __init__(self, code: str, message: str, *, status: int, details: dict[str, Any],
                 request_id: str) -> None:
        super().__init__(f"{code}: {message} (request {request_id})")
        self.code, self.message, self.status = code, message, status
        self.details, self.request_id = details, request_id


def envelope_result(url: str, status: int, body: bytes) -> Any:
    """The result of an envelope answered with `status` and `body`, or its error raised."""
    try:
        envelope = json.loads(body)
    except ValueError:
        raise ClientError(f"{url} answered HTTP {status} without a JSON envelope: is this "
                          "the better-compute API?") from None
    if not isinstance(envelope, dict) or "ok" not in envelope:
        raise ClientError(f"{url} answered something that is not an API envelope")
    if not envelope["ok"]:
        error = envelope.get("error") or {}
        raise ApiError(error.get("code", "internal"), error.get("message", ""),
                       status=status, details=error.get("details") or {},
                       request_id=envelope.get("requestId", ""))
    return envelope["result"]
