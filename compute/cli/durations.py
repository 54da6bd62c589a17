"""Durations as operators type them: 90s, 15m, 2h, 1d (or a sum such as 1h30m)."""

from __future__ import annotations

import re

import click

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+)(ms|s|m|h|d)")


def parse_duration_ms(text: str) -> int:
    text = text.strip().lower()
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration such as 90s, 15m, 2h or 1d")
    return sum(int(n) * _UNITS_MS[u] for n, u in parts)


class Duration(click.ParamType):
    """A duration in milliseconds; bounds are given, and refused, in the user's units."""

    name = "duration"

    def __init__(self, *, minimum: str | None = None, maximum: str | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            ms = parse_duration_ms(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)
        low = parse_duration_ms(self.minimum) if self.minimum else 0
        high = parse_duration_ms(self.maximum) if self.maximum else None
        if ms < low or (high is not None and ms > high):
            bounds = f"between {self.minimum} and {self.maximum}" if self.maximum else \
                f"at least {self.minimum}"
            self.fail(f"{value} is not {bounds}", param, ctx)
        return ms
