"""`assert_wrote`: pin what one service call wrote to the audit trail and the outbox."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from audit.models import AuditEvent
from compute.platform.events.models import Event


@dataclass
class Written:
    """What the block wrote: audit actions (`!` marks a denied row) and event types."""

    audit: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


def _marks() -> tuple[int, int]:
    last_audit = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first()
    last_event = Event.objects.order_by("-seq").values_list("seq", flat=True).first()
    return last_audit or 0, last_event or 0


@contextmanager
def recorded() -> Iterator[Written]:
    """What the block wrote, filled in when it ends (whether or not it raised)."""
    audit_mark, event_mark = _marks()
    written = Written()
    try:
        yield written
    finally:
        rows = list(AuditEvent.objects.filter(seq__gt=audit_mark).order_by("seq")
                    .values_list("action", "allowed"))
        written.audit = [action if allowed else f"!{action}" for action, allowed in rows]
        written.events = list(Event.objects.filter(seq__gt=event_mark).order_by("seq")
                              .values_list("type", flat=True))


@contextmanager
def assert_wrote(*, audit: str | Sequence[str] | None, events: Sequence[str] = (),
                 denied: bool = False) -> Iterator[Written]:
    """Assert the block wrote exactly one audit row with this action (allowed, or denied
    with `denied=True`; `audit=None`: none at all) and exactly these event types, in order.

    Works inside a test transaction (rows are read back by sequence). A block that raises
    is checked too (a refused call writes its denied row, or nothing), then the exception
    propagates.
    """
    try:
        with recorded() as written:
            yield written
    finally:
        _check(written, audit, events, denied)


def _check(written: Written, audit: str | Sequence[str] | None, events: Sequence[str],
           denied: bool) -> None:
    expected_audit = [] if audit is None else [audit] if isinstance(audit, str) else list(audit)
    if denied:
        expected_audit = [f"!{action}" for action in expected_audit]
    assert written.audit == expected_audit, f"audit rows {written.audit}, not {expected_audit}"
    assert written.events == list(events), f"events {written.events}, not {list(events)}"
