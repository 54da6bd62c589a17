"""Writes compute/client/methods.py, the typed client's methods, from the OpenAPI document
(itself built from the registry and the input schemas the API validates with), so the client
cannot drift from the API: `python -m compute.http.clientgen` rewrites it, and a test fails
when the file differs from what this writes."""

from __future__ import annotations

import keyword
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from compute.http.openapi import envelope_operations

TARGET = Path(__file__).resolve().parents[1] / "client" / "methods.py"
TYPES = {"integer": "int", "string": "str", "boolean": "bool", "number": "float"}


def python_name(wire: str) -> str:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", wire).lower()
    return f"{name}_" if keyword.iskeyword(name) else name


def python_type(schema: dict[str, Any]) -> str:
    if schema.get("type") == "array":
        return f"builtins.list[{python_type(schema.get('items', {}))}]"
    if schema.get("type") == "object" or "properties" in schema:
        return "dict[str, Any]"
    return TYPES.get(schema.get("type", ""), "Any")


def _fill(pieces: list[str], first: str, indent: str, last: str) -> list[str]:
    """`first` + pieces joined by ', ' + `last`, wrapped at 100 columns."""
    if not pieces:
        return [first + last]
    lines, current = [], first
    for i, piece in enumerate(pieces):
        piece += ", " if i < len(pieces) - 1 else last
        if len(current) + len(piece.rstrip()) > 100 and current.strip():
            lines.append(current.rstrip())
            current = indent + piece
        else:
            current += piece
    lines.append(current.rstrip())
    return lines


def _method(operation: dict[str, Any]) -> list[str]:
    action = operation["operationId"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    required = set(schema.get("required", []))
    properties = schema.get("properties", {})
    ordered = sorted(properties, key=lambda wire: (wire not in required, wire == "tenantId"))
    params = [f"{python_name(w)}: {python_type(properties[w])}" if w in required else
              f"{python_name(w)}: {python_type(properties[w])} | None = None" for w in ordered]
    retry = "True" if not operation["x-mutating"] else (
        "idempotency_key is not None" if "idempotencyKey" in properties else "False")
    name = python_name(action.split(".")[1])
    lines = _fill(["self", *(["*", *params] if params else [])], f"    def {name}(",
                  " " * 12, ") -> Any:")
    summary = textwrap.wrap(operation["summary"].replace('"""', "'"), 84)
    lines += ([f'        """{summary[0]}"""'] if len(summary) == 1 else
              [f'        """{summary[0]}', *(f"        {s}" for s in summary[1:]),
               '        """'])
    lines += _fill([f'"{w}": {python_name(w)}' for w in ordered],
                   f'        return self._call("{action}", {{', " " * 12,
                   f"}}, retry={retry})")
    return [*lines, ""]


def render() -> str:
    groups: dict[str, list[dict[str, Any]]] = {}
    for operation in envelope_operations():
        groups.setdefault(operation["operationId"].split(".")[0], []).append(operation)
    out = ['"""The typed client\'s methods, one per API method. Written by',
           '`python -m compute.http.clientgen` from the OpenAPI document; do not edit."""', "",
           "from __future__ import annotations", "", "import builtins",
           "from typing import Any", "",
           "from compute.client.base import Group", "", ""]
    for group, operations in sorted(groups.items()):
        out += [f"class {group[0].upper()}{group[1:]}(Group):",
                f'    """{group}.* methods."""', ""]
        for operation in sorted(operations, key=lambda o: o["operationId"]):
            out += _method(operation)
        out += [""]
    out += ["GROUPS: dict[str, type[Group]] = {"]
    out += [f'    "{python_name(g)}": {g[0].upper()}{g[1:]},' for g in sorted(groups)]
    out += ["}", ""]
    return "\n".join(out).replace("\n\n\n\nGROUPS", "\n\n\nGROUPS")


if __name__ == "__main__":
    import django

    from compute.core.config import export_default

    export_default("DJANGO_SETTINGS_MODULE", "compute.project.settings")
    django.setup()
    TARGET.write_text(render())
    sys.stdout.write(f"wrote {TARGET}\n")
