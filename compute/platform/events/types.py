"""The registry of event types. Each app declares its own in its `events.py`, as a `StrEnum`
decorated with `@event_types`; the registry is complete once the apps are loaded
(`compute.platform.apps` imports every app's `events` module before any API module). Emitters name a
member of their app's enum; `events list --types` checks its globs against the registry. A
retired type is kept (commented as such), never reused."""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cache
from typing import TypeVar

from compute.core.errors import InvalidArgument

# Every declared type -> the module that declared it.
REGISTERED: dict[str, str] = {}
Types = TypeVar("Types", bound=type[StrEnum])


class EventType(StrEnum):
    """What `event_emit` takes: a member of an app's enum (each subclasses `StrEnum`)."""


def event_types(declared: Types) -> Types:
    """Registers an app's event types: `@event_types class FleetEvent(StrEnum): …`."""
    values = [member.value for member in declared]  # type: ignore[attr-defined]
    for value in values:  # all checked before any is registered
        owner = REGISTERED.get(value, declared.__module__)
        if owner != declared.__module__:
            raise ValueError(f"event type {value} is declared by {owner} already")
    REGISTERED.update(dict.fromkeys(values, declared.__module__))
    type_globs_pattern.cache_clear()
    return declared


def known_types() -> list[str]:
    return sorted(REGISTERED)


def known(value: str) -> str:
    """`value` when it is a registered type; a ValueError naming it otherwise."""
    if value not in REGISTERED:
        raise ValueError(f"{value!r} is not a registered event type")
    return str(value)


@cache
def type_globs_pattern() -> str:
    """`*`, a type, or a group of them (`node.*`, `node.acceptance.*`), comma-separated."""
    forms = {r"\*"} | {re.escape(t) for t in REGISTERED}
    for name in REGISTERED:
        parts = name.split(".")
        forms |= {re.escape(".".join(parts[:n])) + r"\.\*" for n in range(1, len(parts))}
    item = f" *(?:{'|'.join(sorted(forms))}) *"
    return f"^(?:{item}(?:,{item})*)?$"


def type_globs_help() -> str:
    return ("`*`, an event type, or a group such as `node.*`, comma-separated "
            f"(known: {', '.join(known_types())})")


def parse_type_globs(types: str | None) -> list[str]:
    """`node.*,reservation.placed` as a list of globs, each `*`, a type or a group."""
    if not re.fullmatch(type_globs_pattern(), types or ""):
        raise InvalidArgument(f"types: {type_globs_help()}", field="types")
    return [t.strip() for t in (types or "").split(",") if t.strip()]
