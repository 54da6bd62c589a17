"""The one audit writer, and the shape of every write service around it.

A write service is `@audited`: one durable transaction, retried as a whole on serialization
failures and deadlocks, in which every path that changes state writes exactly one audit row
(with its outbox events). `audit_record` refuses a second row in the same service, and a row
outside any service; a service that wrote to the database without its row is refused at
commit, unless the path said why none is due (`audit_exempt`). The rule is checked on every
call, not only in tests.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils import timezone

from audit.context import current_stamp
from audit.models import AuditEvent
from compute.core.db import TXID_SQL, hot_rows_last, insert_row, retrying

P = ParamSpec("P")
R = TypeVar("R")

_written: ContextVar[list[str] | None] = ContextVar("bc_audit_written", default=None)
_EXEMPT = "exempt: "


class AuditDiscipline(RuntimeError):
    """A write wrote a second audit row, one outside an `@audited` service, or none."""


def audited(func: Callable[P, R]) -> Callable[P, R]:
    """Make `func` a write service: durable transaction, outermost retry, one audit row."""

    @functools.wraps(func)
    def once(*args: P.args, **kwargs: P.kwargs) -> R:
        token = _written.set([])
        writes = _Writes()
        try:
            with transaction.atomic(durable=True), connection.execute_wrapper(writes):
                with hot_rows_last():
                    result = func(*args, **kwargs)
                if writes.rows and not _written.get():
                    raise AuditDiscipline(f"{func.__qualname__} wrote {writes.first} "
                                          "without its audit row")
                return result
        finally:
            _written.reset(token)

    return retrying(once)


# A statement that writes rows: INSERT INTO, UPDATE <table> [alias] SET, DELETE FROM (in a
# WITH too); never SELECT ... FOR [NO KEY] UPDATE, which only locks.
_WRITE = re.compile(r'\bINSERT\s+INTO\s+(?P<i>[\w".]+)|\bDELETE\s+FROM\s+(?P<d>[\w".]+)'
                    r'|\bUPDATE\s+(?P<u>[\w".]+)(?:\s+(?:AS\s+)?\w+)?\s+SET\b', re.IGNORECASE)


class _Writes:
    """Counts the rows a service's statements wrote, as the driver reports them (a write
    that touched no row, such as a claim already made, is none)."""

    def __init__(self) -> None:
        self.rows = 0
        self.first = ""

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: dict[str, Any]) -> Any:
        result = execute(sql, params, many, context)
        found = _WRITE.search(sql)
        if found:
            count = context["cursor"].rowcount
            if count != 0:
                self.rows += max(count, 1)  # -1: the driver cannot tell, so a write
                table = found.group("i") or found.group("d") or found.group("u")
                self.first = self.first or table.strip('"')
        return result


def audit_exempt(reason: str) -> None:
    """Let this path of an `@audited` service commit its write without an audit row, saying
    why none is due (bookkeeping nobody decided: a report's time, a waiting reservation's
    reason). A later `audit_record` in the same service is refused."""
    written = _written.get()
    if written is None:
        raise AuditDiscipline(f"{reason}: only an @audited service may be exempted")
    written.append(_EXEMPT + reason)


def audit_record(*, tenant_id: str, actor_id: str, action: str, target: str = "",
                 data: dict[str, Any] | None = None, allowed: bool = True,
                 reason: str = "") -> AuditEvent:
    """Append the service's one audit row, stamped with the current request.

    The row takes no lock: its position is given after the service commits
    (audit.sequencer), so writers of one tenant never wait for each other here.
    """
    written = _written.get()
    if written is None:
        raise AuditDiscipline(f"{action}: audit rows are written by @audited services only")
    if written:
        raise AuditDiscipline(f"{action}: this service already wrote {written[0]}")
    written.append(action)
    stamp = current_stamp()
    event = AuditEvent(
        tenant_id=tenant_id, actor_id=actor_id, action=action, target=target,
        allowed=allowed, reason=reason or stamp.decision_reason,
        decision_id=stamp.decision_id, request_id=stamp.request_id, origin=stamp.origin,
        data=json.loads(json.dumps(data or {}, cls=DjangoJSONEncoder)),
        created_at=timezone.now())
    insert_row(event, txid=TXID_SQL)
    return event


@audited
def audit_denied(*, tenant_id: str, actor_id: str, action: str, target: str = "",
                 reason: str, data: dict[str, Any] | None = None) -> AuditEvent:
    """Record a refusal (IAM said no, a join or report did not prove itself) on its own:
    the refused change is rolled back, its denied row is not."""
    return audit_record(tenant_id=tenant_id, actor_id=actor_id, action=action, target=target,
                        allowed=False, reason=reason, data=data)
