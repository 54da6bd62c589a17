"""Domain errors and the one table that maps them to HTTP and gRPC.

Services raise these; only the edges (the API envelope, the gRPC interceptor, the watch
consumer) turn them into responses.
"""

from __future__ import annotations

from typing import ClassVar


class ComputeError(Exception):
    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500
    grpc_status: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidArgument(ComputeError):
    code = "invalid_argument"
    http_status = 400
    grpc_status = "INVALID_ARGUMENT"


class Unauthenticated(ComputeError):
    code = "unauthenticated"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"


class PermissionDenied(ComputeError):
    code = "permission_denied"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"


class CsrfHeaderMissing(PermissionDenied):
    code = "csrf_header_missing"


class NotFound(ComputeError):
    code = "not_found"
    http_status = 404
    grpc_status = "NOT_FOUND"


class Conflict(ComputeError):
    code = "conflict"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class AlreadyExists(Conflict):
    code = "already_exists"
    grpc_status = "ALREADY_EXISTS"


class IdempotencyMismatch(Conflict):
    code = "idempotency_key_reused"


class CapacityConflict(Conflict):
    code = "capacity_conflict"


class NeverFits(Conflict):
    """No machine of the pool could ever hold the request, however much frees."""

    code = "never_fits"


class QuotaExceeded(Conflict):
    code = "quota_exceeded"


class LimitExceeded(Conflict):
    """One of an offering's limits against hoarding; details name it and the numbers."""

    code = "limit_exceeded"


class InvalidState(Conflict):
    code = "invalid_state"


class TooManyRequests(ComputeError):
    code = "too_many_requests"
    http_status = 429
    grpc_status = "RESOURCE_EXHAUSTED"


class PayloadTooLarge(ComputeError):
    code = "payload_too_large"
    http_status = 413
    grpc_status = "RESOURCE_EXHAUSTED"


class RequestTimeout(ComputeError):
    code = "request_timeout"
    http_status = 408
    grpc_status = "DEADLINE_EXCEEDED"


class PreconditionFailed(ComputeError):
    code = "failed_precondition"
    http_status = 412
    grpc_status = "FAILED_PRECONDITION"


class Unavailable(ComputeError):
    """Something the call needs (such as a node's answer) did not come in time; retry."""

    code = "unavailable"
    http_status = 503
    grpc_status = "UNAVAILABLE"


def all_error_classes() -> list[type[ComputeError]]:
    """Every error class, for the OpenAPI document and the contract tests."""
    found: list[type[ComputeError]] = []
    pending: list[type[ComputeError]] = [ComputeError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: (c.http_status, c.code))
