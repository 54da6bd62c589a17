"""What every API command shares: output options, the client, error handling."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from compute.cli.client import Client, Config
from compute.cli.output import render

OUTPUTS = click.Choice(["table", "wide", "json", "yaml"])


def output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--output, --query and --tenant on a command (they go after its own arguments)."""
    func = click.option(
        "--tenant", "tenant", metavar="TENANT",
        help="Act in this tenant (id or slug); default BETTER_COMPUTE_TENANT.")(func)
    func = click.option("--query", "query", metavar="PATH",
                        help="Print only this dotted path of the result, e.g. id.")(func)
    return click.option("--output", "-o", "output", type=OUTPUTS,
                        help="Output format (table on a terminal, json otherwise; wide: a "
                        "table that never cuts a value).")(func)


def client(timeout: float = 30.0) -> Client:
    """The CLI's client; `timeout` seconds for each answer (longer for a waiting call)."""
    return Client(Config.from_env(), timeout=timeout)


def show(result: Any, *, output: str | None, query: str | None,
         columns: list[str] | None = None) -> None:
    text = render(result, output=output, path=query, columns=columns)
    if text:
        click.echo(text)


def call_and_show(method: str, body: dict[str, Any], *, tenant: str | None,
                  output: str | None, query: str | None,
                  columns: list[str] | None = None) -> Any:
    result = client().call(method, body, tenant=tenant)
    show(result, output=output, query=query, columns=columns)
    return result


def api_command(group: click.Group, name: str, method: str, *,
                columns: list[str] | None = None) -> Callable[..., Any]:
    """Declare `group name` as a call of `method`; the function maps options to the body."""

    def wrap(func: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
        @group.command(name, help=func.__doc__)
        @output_options
        @functools.wraps(func)
        def command(*, output: str | None, query: str | None, tenant: str | None,
                    **options: Any) -> None:
            call_and_show(method, func(**options), tenant=tenant, output=output, query=query,
                          columns=columns)

        return command

    return wrap


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` with a JSON value when it parses as JSON, a string otherwise."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r} is not key=value")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def read_json_file(path: str) -> Any:
    try:
        with open(path) as handle:
            return json.load(handle)
    except OSError as error:
        raise click.BadParameter(f"cannot read {path}: {error.strerror}") from error
    except ValueError as error:
        raise click.BadParameter(f"{path} is not valid JSON: {error}") from error


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)
