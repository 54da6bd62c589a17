"""Migrations are expand/contract: the previous release runs on the migrated schema.

The database is migrated by this release; then the previous release's `dev` (from a copy of
its tree at PREVIOUS_RELEASE: its API, gateway, workers and simulated agents) runs on it,
joins machines (inserting nodes without this release's columns), books, binds and
releases."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compute.core import pg
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

PREVIOUS_RELEASE = "4b1748b6df2b4d949c559e2af061ab828f7fd927"  # 0.1, before agent versions
REPOSITORY = Path(__file__).resolve().parents[2]


def previous_tree(into: Path) -> Path:
    """The previous release's files (`git archive` of its commit)."""
    present = subprocess.run(["git", "-C", str(REPOSITORY), "cat-file", "-e",
                              f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True)
    if present.returncode != 0:
        pytest.skip(f"this checkout has no history back to {PREVIOUS_RELEASE[:12]}")
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", PREVIOUS_RELEASE],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


@pytest.mark.timeout(900)  # ~150 s; more than 300 s on a loaded 2-core machine
def test_the_previous_release_runs_on_the_migrated_schema(tmp_path, monkeypatch):
    old = previous_tree(tmp_path / "previous")
    server = pg.throwaway().start()
    try:
        env = {"DATABASE_URL": server.url, "DJANGO_SETTINGS_MODULE": "compute.project.settings"}
        migrated = subprocess.run([sys.executable, "-m", "django", "migrate", "--no-input"],
                                  cwd=REPOSITORY, env={**_base_env(), **env},
                                  capture_output=True, text=True)
        assert migrated.returncode == 0, migrated.stderr
        assert "0022_node_agent_and_gateway" in _applied(server.url)
        monkeypatch.chdir(old)  # `dev` and all it starts import the previous release's code
        stack = start_stack(tmp_path, "--sim", "2", env_extra={
            "DATABASE_URL": server.url, "PYTHONPATH": str(old)})
        try:
            _workload(stack, old)
        finally:
            stop_stack(stack)
    finally:
        server.stop()


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items()
            if not k.startswith(("BETTER_COMPUTE", "DATABASE_URL"))}


def _applied(url: str) -> set[str]:
    import psycopg

    with psycopg.connect(url) as db:
        return {name for (name,) in db.execute("SELECT name FROM django_migrations")}


def _workload(stack: Stack, old: Path) -> None:
    version = subprocess.run([sys.executable, "-m", "compute.cli.main", "--version"], cwd=old,
                             env={**stack.env, "PYTHONPATH": str(old)}, capture_output=True,
                             text=True)
    assert version.returncode == 0, version.stderr
    nodes = stack.json("nodes", "list", "--pool", stack.env["POOL"])["items"]
    machines = [n for n in nodes if n["role"] == "node"]
    assert len(machines) == 2
    assert all(n["connectivity"] == "connected" for n in machines)
    assert all("agentVersion" not in n for n in machines)  # the previous release's answer
    held = [stack.json("reserve", "--pool", stack.env["POOL"], "--gpus", "4", "--for", "1h")
            for _ in range(3)]

    def states() -> list[str]:
        return [stack.json("reservations", "get", h["id"])["state"] for h in held]

    assert wait_until(lambda: states() == ["active"] * 3, 120), states()
    for hold in held:
        stack.json("release", hold["id"])
    assert wait_until(lambda: states() == ["released"] * 3, 60), states()
