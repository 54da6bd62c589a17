"""`capacity --timeline` as a terminal shows it: one line per device, one character per
slice of time, sized to the terminal's width, and booked against bookable GPUs per slice
under it."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from typing import Any

OWN, BUSY, MAINTENANCE, WAITING, FREE, DOWN = "█", "▒", "/", "┄", "·", " "
SPARKS = "_▁▂▃▄▅▆▇█"  # nothing booked, then eighths of the bookable GPUs
LEGEND = (f"{OWN} booked (a letter per tenant where the pool is yours)  {BUSY} another "
          f"tenant  {MAINTENANCE} maintenance  {WAITING} waiting  {FREE} free  "
          "| now")


def when(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def timeline_text(result: dict[str, Any], width: int) -> str:
    """The timeline in at most `width` columns."""
    start, end = when(result["from"]), when(result["to"])
    rows = result["rows"]
    labels = [row_label(row) for row in rows]
    label_width = min(max((len(label) for label in labels), default=8), 40)
    note_width = max((len(row["state"]) + 2 for row in rows if row["state"] != "ok"),
                     default=0)
    columns = max(10, width - label_width - 2 - note_width)
    slice_seconds = (end - start).total_seconds() / columns

    def column(at: datetime) -> int:
        return int((at - start).total_seconds() // slice_seconds)

    def span(a: str, b: str) -> range:
        first, last = column(max(when(a), start)), column(min(when(b), end)) - 1
        return range(max(first, 0), min(max(last, first), columns - 1) + 1)

    tenants = sorted({bar["tenant"] for bar in result["bars"] if bar.get("tenant")})
    letters = {slug: (OWN if len(tenants) == 1 else chr(ord("A") + i % 26))
               for i, slug in enumerate(tenants)}
    cells = {row["id"]: [FREE if row["state"] == "ok" else DOWN] * columns for row in rows}
    for item in result["pending"]:
        for device_id in item["deviceIds"]:
            if device_id in cells and item["start"]:
                for c in span(item["start"], item["end"]):
                    cells[device_id][c] = WAITING
    for bar in result["bars"]:
        mark = (MAINTENANCE if bar["kind"] == "maintenance" else BUSY if bar["kind"] == "busy"
                else letters[bar["tenant"]])
        for c in span(bar["start"], bar["end"]):
            cells[bar["deviceId"]][c] = mark
    now = when(result["now"])
    now_column = column(now) if start <= now < end else None
    lines = [f"pool {result['poolId']}: {start.astimezone(UTC):%Y-%m-%d %H:%M} to "
             f"{end.astimezone(UTC):%Y-%m-%d %H:%M} UTC, one column "
             f"{format_seconds(slice_seconds)}", axis(start, slice_seconds, columns,
                                                       label_width, now_column)]
    for row, label in zip(rows, labels, strict=True):
        line = cells[row["id"]]
        if now_column is not None and line[now_column] == FREE:
            line = [*line[:now_column], "|", *line[now_column + 1:]]
        note = f"  {row['state']}" if row["state"] != "ok" else ""
        lines.append(f"{label[:label_width]:<{label_width}}  {''.join(line)}{note}")
    booked = sparkline(result, start, slice_seconds, columns)
    lines.append(f"{'booked GPUs':<{label_width}}  {booked}")
    lines += textwrap.wrap(LEGEND + ("" if len(tenants) < 2 else "  tenants: " + ", ".join(
        f"{letters[t]} {t}" for t in tenants)), width=max(width, 40))
    if result["truncated"]:
        lines.append(f"(the first {len(rows)} devices)")
    for item in result["pending"]:
        start_text = (f"{when(item['start']).astimezone(UTC):%Y-%m-%d %H:%M} UTC "
                      f"({item['startFrom']})" if item["start"] else "no start found")
        lines += textwrap.wrap(f"waiting #{item['position']} {item['reservationId']}: "
                               f"{item['count']} {item['class']} from {start_text}: "
                               f"{item['why']}", width=max(width, 40),
                               subsequent_indent="  ")
    return "\n".join(lines)


def row_label(row: dict[str, Any]) -> str:
    if row["parentId"]:
        return f"  └ {row['profile'] or row['class']}"
    domain = f" {row['nvlinkDomain']}" if row["nvlinkDomain"] else ""
    return f"{row['node']}{domain} #{row['index']}"


def axis(start: datetime, slice_seconds: float, columns: int, label_width: int,
         now_column: int | None) -> str:
    """Times under every tenth column (HH:MM, or the day when a column is an hour or more)."""
    line = [" "] * columns
    for c in range(0, columns - 5, 10):
        at = datetime.fromtimestamp(start.timestamp() + c * slice_seconds, UTC)
        text = f"{at:%H:%M}" if slice_seconds < 3600 else f"{at:%d %b}"
        line[c:c + len(text)] = list(text)
    if now_column is not None and line[now_column] == " ":
        line[now_column] = "v"
    return f"{'':<{label_width}}  {''.join(line[:columns])}"


def sparkline(result: dict[str, Any], start: datetime, slice_seconds: float,
              columns: int) -> str:
    """Booked GPUs against bookable per column, from the steps each column falls in."""
    steps = result["utilisation"]
    out = []
    for c in range(columns):
        at = start.timestamp() + (c + 0.5) * slice_seconds
        step = next((s for s in steps if when(s["start"]).timestamp() <= at
                     < when(s["end"]).timestamp()), None)
        if step is None or not step["allocatableGpuHours"]:
            out.append(" ")
            continue
        part = min(step["allocatedGpuHours"] / step["allocatableGpuHours"], 1.0)
        out.append(SPARKS[round(part * (len(SPARKS) - 1))])
    return "".join(out)


def format_seconds(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 60:.3g} min"
