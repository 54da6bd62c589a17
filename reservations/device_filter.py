"""Device selectors such as `vramGiB >= 80 && product == "H100-SXM5-80GB"`.

A tiny grammar, parsed (never evaluated as code): comparisons joined by `&&` (or `and`),
each `<attribute> <op> <value>` with op one of == != >= <= > < and a number or a quoted
string as value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db.models import Q

from compute.core.errors import InvalidArgument

ATTRIBUTES: dict[str, str] = {  # wire name -> field of fleet.Device
    "vramGiB": "vram_gib",
    "product": "product",
    "model": "model",
    "index": "index",
    "nvlinkDomain": "nvlink_domain",
}
_LOOKUPS = {"==": "exact", "!=": "exact", ">=": "gte", "<=": "lte", ">": "gt", "<": "lt"}
_TEXT_FIELDS = {"product", "model", "nvlink_domain"}
_CLAUSE = re.compile(
    r"""^\s*(?P<attr>[A-Za-z]+)\s*(?P<op>==|!=|>=|<=|>|<)\s*"""
    r"""(?P<value>-?\d+(?:\.\d+)?|"[^"]*"|'[^']*')\s*$""")
_AND = re.compile(r"\s*(?:&&|\band\b)\s*")


_NUMBER_RANGE = (-(2**31), 2**31 - 1)  # the numeric attributes are integer columns


@dataclass(frozen=True)
class Clause:
    attribute: str
    op: str
    value: float | str

    def to_q(self) -> Q:
        q = Q(**{f"{self.attribute}__{_LOOKUPS[self.op]}": self.value})
        return ~q if self.op == "!=" else q


def _typed(attr: str, raw: str) -> float | str:
    """The clause's value, checked against the attribute it compares (a clear refusal
    naming both, never a query that cannot run)."""
    field = ATTRIBUTES[attr]
    if raw[0] in "\"'":
        text = raw[1:-1]
        if field not in _TEXT_FIELDS:
            raise InvalidArgument(f"selector: {attr} is a number; compare it with one, "
                                  f"e.g. {attr} >= 80, not with {raw}", field="selector")
        if "\x00" in text or not text.isprintable():
            raise InvalidArgument(f"selector: the value of {attr} has a control character",
                                  field="selector")
        return text
    if field in _TEXT_FIELDS:
        raise InvalidArgument(f"selector: {attr} is text; quote the value, e.g. "
                              f"{attr} == \"{raw}\"", field="selector")
    number = float(raw)
    if not _NUMBER_RANGE[0] <= number <= _NUMBER_RANGE[1]:
        raise InvalidArgument(f"selector: {raw} is out of range for {attr}", field="selector")
    return number


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
        clauses.append(Clause(ATTRIBUTES[attr], match["op"], _typed(attr, match["value"])))
    return DeviceFilter(tuple(clauses))
