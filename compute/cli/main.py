"""`better-compute`: every command is an HTTP call to BETTER_COMPUTE_URL, except `dev`."""

from __future__ import annotations

import sys

import click

from bcd.contract.version import version
from compute.cli.client import ApiError, CliError
from compute.cli.common import call_and_show, output_options, parse_assignment
from compute.cli.lazy import LazyGroup

# Each command where it lives, imported when it is used.
RESOURCES = {name: f"compute.cli.resources:{attribute}" for name, attribute in (
    ("system", "system"), ("tenants", "tenants"), ("tokens", "tokens"), ("sites", "sites"),
    ("pools", "pools"), ("offerings", "offerings"), ("events", "events"),
    ("join-tokens", "join_tokens"), ("pki", "pki"))}
LEDGER = {name: f"compute.cli.ledger:{name}" for name in (
    "nodes", "maintenance", "capacity", "reserve", "reservations", "series", "release",
    "extend", "sandboxes", "usage")}
LAZY = {**RESOURCES, **LEDGER, "images": "compute.cli.images:images",
        "audit": "compute.cli.audit:audit", "daemon": "compute.cli.install_script:daemon",
        "dev": "compute.cli.dev:dev", "serve": "compute.cli.serve:serve",
        "sim": "compute.cli.sim.command:sim", "webhooks": "compute.cli.webhooks:webhooks",
        "login": "compute.cli.login:login"}
ALSO = {"nodes": ("compute.cli.baremetal",)}  # it adds its commands to `nodes`

_process_value = click.Option.process_value


def _refuse_an_option_as_a_value(self: click.Option, ctx: click.Context, value: object) -> object:
    """`--pool $UNSET --vcpus 8` would take `--vcpus` as the pool and then complain that
    --vcpus is missing; name the option that lost its value instead."""
    if (not self.is_flag and not self.count and isinstance(value, str)
            and value.startswith("--") and value[2:3].isalpha()):
        raise click.BadParameter(f"needs a value, but got the option {value} (is a variable "
                                 "in the command empty?)", ctx=ctx, param=self)
    return _process_value(self, ctx, value)


click.Option.process_value = _refuse_an_option_as_a_value  # type: ignore[method-assign]


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """`--version`, read from the package's metadata only when asked."""
    if value and not ctx.resilient_parsing:
        click.echo(f"better-compute {version()}")
        ctx.exit()


@click.group(cls=LazyGroup, lazy=LAZY, also=ALSO,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_show_version, help="Show the version and exit.")
def cli() -> None:
    """better-compute: a control plane for GPU, CPU and sandbox capacity.

    Configure with BETTER_COMPUTE_URL, BETTER_COMPUTE_TOKEN and BETTER_COMPUTE_TENANT.
    """




@cli.command("api")
@click.argument("method")
@click.argument("fields", nargs=-1)
@output_options
def api(method: str, fields: tuple[str, ...], output: str | None, query: str | None,
        tenant: str | None) -> None:
    """Call any API method: api GROUP.METHOD key=value… (values may be JSON)."""
    body = dict(parse_assignment(field) for field in fields)
    call_and_show(method, body, tenant=tenant, output=output, query=query)


@cli.command("mcp")
@click.option("--http", "http", default=None, metavar="HOST:PORT",
              help="Serve streamable HTTP here (each request's bearer token is its caller) "
                   "instead of stdio (BETTER_COMPUTE_TOKEN is the caller).")
def mcp_command(http: str | None) -> None:
    """Serve the API as Model Context Protocol tools and resources."""
    import asyncio

    from compute.cli.client import check_url
    from compute.cli.mcp import serve_http, serve_stdio
    from compute.core import config

    url = check_url(config.text("BETTER_COMPUTE_URL") or
                    "http://127.0.0.1:3000/api/compute")
    if http is None:
        asyncio.run(serve_stdio(url))
        return
    host, _, port = http.rpartition(":")
    serve_http(url, host or "127.0.0.1", int(port))


@cli.command("gateway", add_help_option=False,
             context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def gateway(ctx: click.Context) -> None:
    """Run the gateway (node sessions over mTLS): gateway --cert-dir DIR [--listen …]."""
    import os

    os.execv(sys.executable, [sys.executable, "-m", "gateway", *ctx.args])  # noqa: S606


@cli.command("workers")
@click.option("--count", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Work-queue workers (they share the 256 shards).")
def workers(count: int) -> None:
    """Run the reconcilers: queue workers plus the django-q2 cluster for periodic jobs."""
    import time

    from compute.cli.dev import Stack
    from compute.core import config
    from compute.core.pg import require_database_url

    env = config.environment(DJANGO_SETTINGS_MODULE="compute.project.settings",
                             DATABASE_URL=require_database_url())
    argv = [sys.executable, "-m", "django"]
    stack = Stack()  # a worker that dies is restarted, with backoff
    for n in range(1, count + 1):
        stack.start([*argv, "bc_worker", "--loop"], env, name=f"worker-{n}")
    stack.start([*argv, "qcluster"], env, name="qcluster")
    click.echo(f"Workers running: {count} queue workers and the django-q2 cluster", err=True)
    try:
        while True:
            stack.watch()
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()


@cli.command("help")
@click.argument("command", nargs=-1)
@click.pass_context
def help_command(ctx: click.Context, command: tuple[str, ...]) -> None:
    """List every command, or show one: help pools offer."""
    target: click.Command = cli
    for name in command:
        if not isinstance(target, click.Group) or name not in target.commands:
            raise CliError(f"no command {' '.join(command)!r}; see better-compute help")
        target = target.commands[name]
    if command:
        click.echo(target.get_help(click.Context(target, info_name=" ".join(command),
                                                 parent=ctx.find_root())))
        return
    click.echo(cli.get_help(ctx.parent or ctx))
    click.echo("\nAll commands:")
    for name, sub in sorted(cli.commands.items()):
        if isinstance(sub, click.Group):
            for child_name, child in sorted(sub.commands.items()):
                label = f"{name} {child_name}"
                click.echo(f"  {label:<24} {summary(child)}")
        else:
            click.echo(f"  {name:<24} {summary(sub)}")


def summary(command: click.Command) -> str:
    """A command's first docstring line, whole (never cut with an ellipsis)."""
    return (command.help or command.short_help or "").strip().split("\n")[0]


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except ApiError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2 if error.status < 500 else 3)
    except CliError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Exit as error:
        sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
