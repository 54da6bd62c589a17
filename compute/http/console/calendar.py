"""The pool calendar's layout: `capacity.timeline`'s rows, bars, pending requests and
utilisation placed on an SVG drawing (coordinates in its viewBox), which the template
writes out as it is. Zoom levels go from hours to weeks; times on the axis are UTC."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils.dateparse import parse_datetime

SPANS = {"6h": timedelta(hours=6), "1d": timedelta(days=1), "3d": timedelta(days=3),
         "1w": timedelta(weeks=1), "2w": timedelta(weeks=2)}
STEPS = {"6h": timedelta(minutes=15), "1d": timedelta(hours=1), "3d": timedelta(hours=3),
         "1w": timedelta(hours=6), "2w": timedelta(hours=12)}
TICKS = {"6h": timedelta(hours=1), "1d": timedelta(hours=3), "3d": timedelta(hours=12),
         "1w": timedelta(days=1), "2w": timedelta(days=2)}
DEFAULT_SPAN = "1d"
WIDTH, LABEL, AXIS = 1000, 190, 24
GPU_ROW, PART_ROW, NODE_GAP = 14, 9, 8
CHART, CHART_TOP = 90, 16
PALETTE = ["#2b6cb0", "#2f855a", "#b7791f", "#9b2c2c", "#6b46c1", "#2c7a7b", "#c05621",
           "#97266d", "#4a5568", "#276749"]


@dataclass(frozen=True)
class View:
    """The window the page shows: where it starts and how long it is."""

    start: datetime
    span: str

    @classmethod
    def of(cls, query: dict[str, str], now: datetime) -> View:
        span = query.get("span") or DEFAULT_SPAN
        span = span if span in SPANS else DEFAULT_SPAN
        start = parse_datetime(query.get("from") or "")
        if start is None or start.tzinfo is None:
            start = now - SPANS[span] / 8  # "now" near the left edge
        tick = TICKS[span]
        epoch = datetime(2000, 1, 1, tzinfo=UTC)
        start = epoch + ((start - epoch) // tick) * tick  # on a tick
        return cls(start, span)

    @property
    def end(self) -> datetime:
        return self.start + SPANS[self.span]

    def query(self, *, start: datetime | None = None, span: str | None = None) -> str:
        when = (start or self.start).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"from={when}&span={span or self.span}"

    def links(self) -> dict[str, str]:
        """Earlier, later, now, and the zoom levels around this one (the centre kept)."""
        names = list(SPANS)
        at = names.index(self.span)
        middle = self.start + SPANS[self.span] / 2
        zoom = {name: self.query(start=middle - SPANS[name] / 2, span=name) for name in names}
        return {"earlier": self.query(start=self.start - SPANS[self.span] / 2),
                "later": self.query(start=self.start + SPANS[self.span] / 2),
                "now": f"span={self.span}",
                "in": zoom[names[max(at - 1, 0)]], "out": zoom[names[min(at + 1,
                                                                          len(names) - 1)]],
                **{f"zoom-{name}": query for name, query in zoom.items()}}


def instant(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def tenant_colour(tenant_id: str) -> str:
    return PALETTE[int(hashlib.sha256(tenant_id.encode()).hexdigest(), 16) % len(PALETTE)]


def layout(timeline: dict[str, Any], view: View) -> dict[str, Any]:
    """Everything the template draws, in viewBox units."""
    start, end = view.start, view.end
    scale = (WIDTH - LABEL) / (end - start).total_seconds()

    def x(at: Any) -> float:
        seconds = (min(max(instant(at), start), end) - start).total_seconds()
        return round(LABEL + seconds * scale, 2)

    rows, y, node = [], AXIS, None
    for row in timeline["rows"]:
        if row["nodeId"] != node:
            y += NODE_GAP if node else 0
            node = row["nodeId"]
            first = True
        else:
            first = False
        height = PART_ROW if row["parentId"] else GPU_ROW
        label = (f"{row['node']} {row['nvlinkDomain'] or ''} #{row['index']}" if first
                 else f"{row['nvlinkDomain'] or ''} #{row['index']}") if not row["parentId"] \
            else f"└ {row['profile'] or row['class']}"
        rows.append({**row, "y": y, "height": height, "label": label.strip(),
                     "first": first})
        y += height
    at = {row["id"]: row for row in rows}
    bars = []
    for bar in timeline["bars"]:
        row = at.get(bar["deviceId"])
        if row is None:
            continue
        left, right = x(bar["start"]), x(bar["end"])
        bars.append({**bar, "x": left, "width": max(round(right - left, 2), 1),
                     "y": row["y"] + 1, "height": row["height"] - 2,
                     "colour": tenant_colour(bar.get("tenantId") or "")})
    pending = []
    for item in timeline["pending"]:
        if not item["start"]:
            continue
        left, right = x(item["start"]), x(item["end"])
        for device_id in item["deviceIds"]:
            row = at.get(device_id)
            if row is not None and right > left:
                pending.append({**item, "x": left, "width": round(right - left, 2),
                                "y": row["y"] + 1, "height": row["height"] - 2})
    now = instant(timeline["now"])
    tick = TICKS[view.span]
    ticks, t = [], start
    while t <= end:
        ticks.append({"x": x(t), "label": t.astimezone(UTC).strftime(
            "%H:%M" if tick < timedelta(days=1) else "%a %d %b")})
        t += tick
    height = y + 4
    return {"rows": rows, "bars": bars, "pending": pending, "ticks": ticks,
            "now": x(now) if start <= now <= end else None, "height": height,
            "width": WIDTH, "label": LABEL, "track": WIDTH - LABEL,
            "chart": chart(timeline["utilisation"], x), "legend": legend(timeline["bars"])}


def chart(steps: list[dict[str, Any]], x: Any) -> dict[str, Any]:
    """Per step: bookable GPUs (the outline), booked GPUs (the bar) and, of those, the part
    the agents measured busy (the darker bar), as GPUs on average over the step."""
    def gpus(hours: float, step: dict[str, Any]) -> float:
        seconds = (instant(step["end"]) - instant(step["start"])).total_seconds()
        return hours * 3600 / seconds if seconds else 0.0

    peak = max((gpus(s["gpuHours"], s) for s in steps), default=0.0) or 1.0
    bars = []
    for step in steps:
        left, right = x(step["start"]), x(step["end"])
        allocatable, allocated = (gpus(step[k], step) for k in ("allocatableGpuHours",
                                                                "allocatedGpuHours"))
        used = (allocated * step["measuredUtilisation"] / 100
                if step["measuredUtilisation"] is not None else None)
        bars.append({"x": left, "width": max(round(right - left - 1, 2), 1),
                     "allocatable": round(allocatable, 2), "allocated": round(allocated, 2),
                     "utilisation": step["measuredUtilisation"],
                     "bookableBar": bottom_up(allocatable / peak),
                     "bookedBar": bottom_up(allocated / peak),
                     "busyBar": bottom_up(used / peak) if used is not None else None,
                     "start": step["start"]})
    return {"bars": bars, "height": CHART, "peak": round(peak, 1)}


def bottom_up(part: float) -> dict[str, float]:
    """A bar of the chart standing on its base line: its top and height."""
    height = round(part * CHART, 2)
    return {"y": round(CHART_TOP + CHART - height, 2), "height": height}


def legend(bars: list[dict[str, Any]]) -> list[dict[str, str]]:
    tenants = {b["tenantId"]: b["tenant"] for b in bars if b.get("tenantId")}
    return [{"tenant": slug, "colour": tenant_colour(tenant_id)}
            for tenant_id, slug in sorted(tenants.items(), key=lambda t: t[1])]
