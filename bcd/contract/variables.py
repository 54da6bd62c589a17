"""Environment variables, each declared once with its type, default and meaning.

The control plane declares its variables in `compute/core/config.py`, the agent its own in
`bcd/config.py`, each with the environment they are read from (the process's, read there and
nowhere else); the settings reference of the documentation is generated from both. A value
that does not parse stops the reader naming the variable and what it expected.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

Kind = Literal["str", "int", "float", "bool", "path"]
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


class VariableError(ValueError):
    """A variable that is set to something its declaration does not allow."""


@dataclass(frozen=True)
class Variable:
    name: str
    kind: Kind
    default: str | int | float | bool | None
    help: str
    reader: str = "control plane"
    secret: bool = False

    def raw(self, environ: Mapping[str, str]) -> str:
        """The variable as set ('' when unset)."""
        return environ.get(self.name, "").strip()

    def value(self, environ: Mapping[str, str]) -> str | int | float | bool | None:
        """The variable parsed as its kind, or its default when unset or empty."""
        text = self.raw(environ)
        if not text:
            return self.default
        try:
            return parse(self.kind, text)
        except ValueError:
            shown = "(a secret, not shown)" if self.secret else repr(text)
            raise VariableError(
                f"{self.name}={shown} is not {ARTICLE[self.kind]}: {self.help}") from None


ARTICLE = {"str": "a string", "int": "a whole number", "float": "a number",
           "bool": "a boolean (1/0, true/false, yes/no, on/off)", "path": "a path"}


def parse(kind: Kind, text: str) -> str | int | float | bool:
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        if text.lower() in TRUE | FALSE:
            return text.lower() in TRUE
        raise ValueError(text)
    return text


class Declared:
    """A set of declared variables, looked up by name and read from `environ` (a live
    mapping: what is exported later is seen)."""

    def __init__(self, *variables: Variable, environ: Mapping[str, str]) -> None:
        self.by_name = {v.name: v for v in variables}
        self.environ = environ

    def __iter__(self) -> Iterator[Variable]:
        return iter(self.by_name.values())

    def __getitem__(self, name: str) -> Variable:
        return self.by_name[name]

    def text(self, name: str) -> str:
        value = self[name].value(self.environ)
        return "" if value is None else str(value)

    def number(self, name: str) -> float:
        value = self[name].value(self.environ)
        if not isinstance(value, int | float):
            raise TypeError(f"{name} is not declared as a number")
        return float(value)

    def whole(self, name: str) -> int:
        value = self[name].value(self.environ)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} is not declared as a whole number")
        return value

    def flag(self, name: str) -> bool:
        return bool(self[name].value(self.environ))

    def is_set(self, name: str) -> bool:
        return bool(self[name].raw(self.environ))
