"""The CLI imports what the command needs: `--version` no HTTP client and no package
metadata, an API call the standard library's HTTP client (not httpx) and no database
driver, Django, gRPC, simulator, bare-metal or dev-stack code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
NEVER = ("psycopg", "django", "grpc", "rest_framework", "compute.cli.sim", "compute.cli.dev",
         "compute.cli.baremetal", "compute.core.pg", "yaml")


def imported(*argv: str) -> set[str]:
    """The modules a CLI run imported (`python -X importtime`)."""
    env = {**os.environ, "BETTER_COMPUTE_URL": "http://127.0.0.1:9/api/compute",
           "BETTER_COMPUTE_TOKEN": f"biam_tok_{'0' * 26}.{'x' * 32}",
           "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "compute.cli.main", *argv],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize(("argv", "also_never"), [
    (("--version",), ("httpx", "compute.client", "compute.cli.ledger", "importlib.metadata")),
    (("api", "system.whoami"), ("compute.cli.ledger", "compute.cli.resources", "httpx")),
    (("reservations", "list"), ("compute.cli.resources", "compute.cli.images", "httpx")),
])
def test_a_command_imports_only_what_it_needs(argv, also_never):
    modules = imported(*argv)
    assert "click" in modules  # the list is read
    loaded = sorted(m for m in modules if m.startswith((*NEVER, *also_never)))
    assert loaded == [], loaded


def test_an_api_call_goes_through_the_standard_librarys_http_client():
    modules = imported("api", "system.whoami")
    assert {"http.client", "compute.cli.wire"} <= modules


def test_every_group_of_the_command_modules_is_reachable():
    """A group added to the resources' or the ledger's list is named in LAZY too."""
    import click

    from compute.cli.ledger import COMMANDS
    from compute.cli.main import cli
    from compute.cli.resources import GROUPS

    listed = cli.list_commands(click.Context(cli))
    for command in [*GROUPS, *COMMANDS]:
        assert command.name in listed, command.name
        assert cli.get_command(click.Context(cli), command.name) is command
