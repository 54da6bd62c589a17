"""The CLI's own errors, before any call reaches a server: each names what is wrong, in the
user's terms, and nothing is minted or written when a command is refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NOWHERE = {"BETTER_COMPUTE_URL": "http://127.0.0.1:9/api/compute",  # nothing listens
           "BETTER_COMPUTE_TOKEN": "biam_tok_01jbx0000000000000000000aa.abcdefghijklmnopqrstu"}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": os.environ["PATH"], **(env or NOWHERE)})


def test_the_readme_placeholder_token_is_called_malformed():
    result = run("better-compute", "api", "system.whoami",
                 env={**NOWHERE, "BETTER_COMPUTE_TOKEN": "biam_…"})
    assert result.returncode == 1
    assert "BETTER_COMPUTE_TOKEN is malformed" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_option_that_receives_another_option_is_named():
    result = run("better-compute", "sandboxes", "create", "--pool", "--vcpus", "8",
                 "--memory", "16")  # as with an unset $CPU_POOL
    assert result.returncode == 2
    assert "'--pool': needs a value, but got the option --vcpus" in result.stderr


def test_a_duration_limit_is_said_in_the_unit_typed():
    result = run("better-compute", "join-tokens", "create", "--pool", "pool_x", "--ttl", "25h")
    assert result.returncode == 2
    assert "25h is not between 1m and 24h" in result.stderr
    assert "86400000" not in result.stderr


def test_out_to_an_existing_file_mints_nothing(tmp_path):
    existing = tmp_path / "join-token"
    existing.write_text("keep me")
    result = run("better-compute", "join-tokens", "create", "--pool", "pool_x", "--ttl", "2h",
                 "--out", str(existing))
    assert result.returncode == 2
    assert "exists; it is never overwritten" in result.stderr
    assert "cannot reach" not in result.stderr  # refused before any call to the server
    assert existing.read_text() == "keep me"


def test_a_failed_mint_leaves_no_empty_token_file(tmp_path):
    target = tmp_path / "join-token"
    result = run("better-compute", "join-tokens", "create", "--pool", "pool_x", "--ttl", "2h",
                 "--out", str(target))
    assert "cannot reach" in result.stderr
    assert not target.exists()


def test_every_program_prints_the_same_version():
    printed = {run(*argv).stdout.strip() for argv in (
        ("better-compute", "--version"), ("bcd", "--version"),
        ("better-compute", "gateway", "--version"))}
    versions = {line.split()[-1] for line in printed}
    assert len(printed) == 3, printed
    assert len(versions) == 1, printed
    assert versions != {"0+unknown"}


@pytest.mark.parametrize(("argv", "usage"), [
    (("better-compute", "help", "pools", "offer"), "Usage: better-compute pools offer "),
    (("bcd", "help"), "usage: bcd "),
])
def test_help_names_each_command_once(argv, usage):
    result = run(*argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(usage), result.stdout[:200]
    assert "better-compute better-compute" not in result.stdout


def test_the_command_list_never_cuts_a_description():
    listing = run("better-compute", "help").stdout.split("All commands:")[1]
    assert "..." not in listing


def test_a_command_starts_without_the_database_driver_or_httpxs_command_line():
    """Every command loads the CLI: the driver (~70 ms) is for `sim run` alone, and httpx's
    own command line (rich, pygments: a fifth of a command's start) for no command."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, compute.cli.main; print(sorted(m for m in "
         "('psycopg', 'django', 'grpc', 'pygments', 'rich.console') if m in sys.modules))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded


def test_a_simulated_agent_that_fails_to_join_says_how_it_ended():
    from compute.cli.dev import exit_reason

    assert exit_reason(1, b"", b"join refused: token spent\n") == (
        "exit status 1: join refused: token spent")
    assert exit_reason(2, b"usage: bcd join ...\n", b"") == "exit status 2: usage: bcd join ..."
    assert exit_reason(-9, b"", b"") == "killed by SIGKILL, saying nothing"


@pytest.mark.parametrize("start", ["yesterday", "-xx"])
def test_a_timeline_start_it_cannot_read_is_named(start):
    result = run("better-compute", "capacity", "--timeline", "--pool", "pool_x", "--from", start)
    assert result.returncode == 2
    assert f"Invalid value for --from: {start!r} is neither -2h" in result.stderr
    assert "Traceback" not in result.stderr
