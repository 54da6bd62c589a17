"""Device selectors such as `vramGiB >= 80 && product == "H100-SXM5-80GB"`.

A tiny grammar, parsed (never evaluated as code): comparisons joined by `&&` (or `and`),
each `<attribute> <op> <value>` with op one of == != >= <= > < and a number or a quoted
string as value.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compute.errors import InvalidArgument

ATTRIBUTES: dict[str, str] = {  # wire name -> attribute of a placement.FreeDevice
    "vramGiB": "vram_gib",
    "product": "product",
    "model": "model",
    "index": "index",
    "nvlinkDomain": "nvlink_domain",
}
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le,
    ">": operator.gt, "<": operator.lt,
}
_CLAUSE = re.compile(
    r"""^\s*(?P<attr>[A-Za-z]+)\s*(?P<op>==|!=|>=|<=|>|<)\s*"""
    r"""(?P<value>-?\d+(?:\.\d+)?|"[^"]*"|'[^']*')\s*$""")
_AND = re.compile(r"\s*(?:&&|\band\b)\s*")


@dataclass(frozen=True)
class Clause:
    attribute: str
    op: str
    value: float | str

    def matches(self, device: Any) -> bool:
        actual = getattr(device, self.attribute)
        if isinstance(self.value, str) != isinstance(actual, str):
            return False
        return _OPS[self.op](actual, self.value)


@dataclass(frozen=True)
class DeviceFilter:
    clauses: tuple[Clause, ...] = ()

    def __call__(self, device: Any) -> bool:
        return all(clause.matches(device) for clause in self.clauses)


def parse_selector(text: str) -> DeviceFilter:
    if not text or not text.strip():
        return DeviceFilter()
    if len(text) > 300:
        raise InvalidArgument("selector: longer than 300 characters", field="selector")
    clauses = []
    for part in _AND.split(text.strip()):
        match = _CLAUSE.match(part)
        if match is None:
            raise InvalidArgument(
                f"selector: cannot parse {part.strip()!r}; write e.g. vramGiB >= 80",
                field="selector")
        attr = match["attr"]
        if attr not in ATTRIBUTES:
            raise InvalidArgument(
                f"selector: unknown attribute {attr!r} (known: {', '.join(ATTRIBUTES)})",
                field="selector")
        raw = match["value"]
        value: float | str = raw[1:-1] if raw[0] in "\"'" else float(raw)
        clauses.append(Clause(ATTRIBUTES[attr], match["op"], value))
    return DeviceFilter(tuple(clauses))
