"""Device selectors such as `vramGiB >= 80 && product == "H100-SXM5-80GB"`.

A tiny grammar, parsed (never evaluated as code): comparisons joined by `&&` (or `and`),
each `<attribute> <op> <value>` with op one of == != >= <= > < and a number or a quoted
string as value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db.models import Q

from compute.errors import InvalidArgument

ATTRIBUTES: dict[str, str] = {  # wire name -> field of fleet.Device
    "vramGiB": "vram_gib",
    "product": "product",
    "model": "model",
    "index": "index",
    "nvlinkDomain": "nvlink_domain",
}
_LOOKUPS = {"==": "exact", "!=": "exact", ">=": "gte", "<=": "lte", ">": "gt", "<": "lt"}
_TEXT_FIELDS = {"product", "model", "nvlink_domain"}
_NOTHING = Q(pk__in=[])
_CLAUSE = re.compile(
    r"""^\s*(?P<attr>[A-Za-z]+)\s*(?P<op>==|!=|>=|<=|>|<)\s*"""
    r"""(?P<value>-?\d+(?:\.\d+)?|"[^"]*"|'[^']*')\s*$""")
_AND = re.compile(r"\s*(?:&&|\band\b)\s*")


@dataclass(frozen=True)
class Clause:
    attribute: str
    op: str
    value: float | str

    def to_q(self) -> Q:
        if isinstance(self.value, str) != (self.attribute in _TEXT_FIELDS):
            return _NOTHING  # a number compared with text (or the reverse) matches nothing
        q = Q(**{f"{self.attribute}__{_LOOKUPS[self.op]}": self.value})
        return ~q if self.op == "!=" else q


@dataclass(frozen=True)
class DeviceFilter:
    clauses: tuple[Clause, ...] = ()

    def to_q(self) -> Q:
        q = Q()
        for clause in self.clauses:
            q &= clause.to_q()
        return q


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
