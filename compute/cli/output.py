"""Printing results: a table on a terminal, JSON or YAML on request, `--query` for one value."""

from __future__ import annotations

import json
import re
import shutil
import sys
from typing import Any

from compute.cli.client import CliError


def query(value: Any, path: str) -> Any:
    """Follow a dotted path (`binding.nodeId`, `items.0.id`) into a result."""
    for part in filter(None, path.split(".")):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and (
                -len(value) <= int(part) < len(value)):
            value = value[int(part)]
        else:
            raise CliError(f"--query {path}: no {part!r} in the result")
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[str] | None = None, *,
          wide: bool = False) -> str:
    """Rows as aligned columns fitted to the terminal (a cut value ends in …); ids are
    never cut, the other columns give way; `wide` never cuts (`--output wide`)."""
    if not rows:
        return "(none)"
    columns = columns or [k for k in rows[0] if not isinstance(rows[0][k], dict | list)][:8]
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    if not wide:
        kept = [_is_id(c, [r[i] for r in cells]) for i, c in enumerate(columns)]
        width = shutil.get_terminal_size((120, 20)).columns
        widths = fit(widths, kept, width - 2 * (len(columns) - 1))

    def line(values: list[str]) -> str:
        return "  ".join(
            (v if len(v) <= w else v[: w - 1] + "…").ljust(w) for v, w in zip(values, widths,
                                                                             strict=True))

    return "\n".join([line([c.upper() for c in columns]), *(line(r) for r in cells)]).rstrip()


MIN_CUT = 6  # a column that gives way keeps this much ("adopt…")
ID = re.compile(r"[a-z]+_[0-9a-z]{16,}")


def _is_id(column: str, values: list[str]) -> bool:
    """A column of ids (`id`, `nodeId`, or values such as `rsv_01m8…`): copied whole."""
    return column == "id" or column.endswith("Id") or (
        any(v != "-" for v in values) and all(v == "-" or ID.fullmatch(v) for v in values))


def fit(widths: list[int], kept: list[bool], room: int) -> list[int]:
    """Column widths within `room`: kept columns whole; the others share what is left,
    the narrow ones whole and the wide ones an even part each (never under MIN_CUT)."""
    if sum(widths) <= room:
        return widths
    left = room - sum(w for w, k in zip(widths, kept, strict=True) if k)
    giving = sorted((w, i) for i, (w, k) in enumerate(zip(widths, kept, strict=True)) if not k)
    fitted = list(widths)
    for n, (natural, index) in enumerate(giving):
        share = max(MIN_CUT, left // (len(giving) - n))
        fitted[index] = min(natural, share)
        left -= fitted[index]
    return fitted


def render(value: Any, *, output: str | None, path: str | None,
           columns: list[str] | None = None) -> str:
    if path:
        value = query(value, path)
        if output is None and not isinstance(value, dict | list):
            return value if isinstance(value, str) else json.dumps(value)
    fmt = output or ("table" if sys.stdout.isatty() else "json")
    wide = fmt == "wide"
    if fmt == "json":
        return json.dumps(value, indent=2, sort_keys=False)
    if fmt == "yaml":
        import yaml  # only for this output

        return yaml.safe_dump(value, sort_keys=False).rstrip()
    if isinstance(value, dict) and isinstance(value.get("items"), list):
        return table(value["items"], columns, wide=wide)
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return table(value, columns, wide=wide)
    if isinstance(value, dict):
        return table([{"field": k, "value": _cell(v)} for k, v in value.items()], wide=wide)
    return _cell(value)
