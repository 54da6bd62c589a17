"""A command group whose commands are imported when used: a call imports its own command's
module and what that needs, not the simulator, bare metal or the dev stack besides."""

from __future__ import annotations

from importlib import import_module
from typing import Any

import click


class LazyGroup(click.Group):
    """`lazy` maps a command's name to `module:attribute`, and `also` a name to modules that
    add subcommands to it when imported (bare metal's `nodes` commands)."""

    def __init__(self, *args: Any, lazy: dict[str, str], also: dict[str, tuple[str, ...]],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy, self.also = lazy, also

    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:
        """Every command, imported (the reference pages, `help` and the tests read them)."""
        for name in self.lazy:
            self._load(name)
        return self._commands

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._commands = value

    def _load(self, name: str) -> click.Command | None:
        if name not in self._commands and name in self.lazy:
            module, attribute = self.lazy[name].split(":")
            command = getattr(import_module(module), attribute)
            for extra in self.also.get(name, ()):
                import_module(extra)
            self._commands[name] = command
        return self._commands.get(name)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        if name is None:
            raise TypeError("a command needs a name")
        self._commands[name] = cmd  # without loading the lazy ones

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self._commands, *self.lazy})
