"""Recurring windows as operators write them, in a time zone.

    <days> <HH:MM>-<HH:MM>

`days` is `daily`, `weekdays` (Monday to Friday), `weekends`, or days named by their first
three letters, comma-separated (`mon,wed,fri`). The window starts at the first time on each
such day and ends at the second, the next day when the second is not later
(`daily 22:00-06:00`). Times are wall-clock times in the series' time zone: across a change
to or from daylight saving time a window keeps its local start and end, so its length in
hours can change that night, and a start inside the hour that is skipped moves forward with
the clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from compute.core.errors import InvalidArgument

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY_SETS = {"daily": frozenset(range(7)), "weekdays": frozenset(range(5)),
            "weekends": frozenset({5, 6})}
_RULE = re.compile(r"^\s*(?P<days>[a-z,]+)\s+(?P<start>\d{2}:\d{2})\s*-\s*(?P<end>\d{2}:\d{2})\s*$")


@dataclass(frozen=True)
class Rule:
    days: frozenset[int]  # Monday is 0
    start: time
    end: time

    def windows(self, zone: ZoneInfo, first: date, last: date) -> Iterator[tuple[datetime,
                                                                                   datetime]]:
        """Each window (start, end) in UTC on the days from `first` to `last`."""
        day = first
        while day <= last:
            if day.weekday() in self.days:
                end_day = day if self.end > self.start else day + timedelta(days=1)
                start = datetime.combine(day, self.start, tzinfo=zone)
                end = datetime.combine(end_day, self.end, tzinfo=zone)
                # (fold 0: a time inside a skipped hour reads with the offset before the
                # change, which moves it forward with the clock)
                yield start.astimezone(UTC), end.astimezone(UTC)
            day += timedelta(days=1)


def parse_rule(text: str) -> Rule:
    match = _RULE.match(text.lower())
    if not match:
        raise InvalidArgument(
            f"every: {text!r} is not '<days> HH:MM-HH:MM', e.g. 'weekdays 09:00-17:00'",
            field="every")
    names = match["days"]
    if names in DAY_SETS:
        days = DAY_SETS[names]
    else:
        unknown = [n for n in names.split(",") if n not in DAY_NAMES]
        if unknown or not names:
            raise InvalidArgument(
                f"every: {', '.join(unknown) or names!r} is not daily, weekdays, weekends or "
                f"days such as mon,wed,fri", field="every")
        days = frozenset(DAY_NAMES.index(n) for n in names.split(","))
    try:
        start, end = time.fromisoformat(match["start"]), time.fromisoformat(match["end"])
    except ValueError:
        raise InvalidArgument(f"every: {text!r} has a time that is not HH:MM (00:00-23:59)",
                              field="every") from None
    if start == end:
        raise InvalidArgument("every: a window must not start and end at the same time",
                              field="every")
    return Rule(days, start, end)


def zone_named(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"timezone: {name!r} is not a time zone such as Europe/Berlin "
                              "or UTC", field="timezone") from None
