"""Who is calling and under which IAM decision: set by the edge, read by `audit_record`.

The envelope sets it for the length of one request, so services need not thread the
request id and decision id through every signature.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class CallStamp:
    request_id: str = ""
    decision_id: str = ""
    decision_reason: str = ""
    origin: str = "internal"


_current: ContextVar[CallStamp] = ContextVar("bc_call_stamp", default=CallStamp())  # noqa: B039


def current_stamp() -> CallStamp:
    return _current.get()


@contextmanager
def stamped(stamp: CallStamp) -> Iterator[None]:
    token = _current.set(stamp)
    try:
        yield
    finally:
        _current.reset(token)
