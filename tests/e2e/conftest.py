"""The dev stack as a real process, and the CLI as real subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from compute.cli.dev import read_env_file
from tests.support.processes import free_port


@dataclass
class Stack:
    process: subprocess.Popen[str]
    env: dict[str, str]
    output: list[str]
    state_dir: Path

    def cli(self, *args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["better-compute", *args], env=env or self.env, input=stdin,
                              capture_output=True, text=True, timeout=timeout, check=False,
                              cwd=cwd)

    def ok(self, *args: str, cwd: Path | None = None) -> str:
        result = self.cli(*args, cwd=cwd)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout.strip()

    def json(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
        """A CLI command's result, as JSON (`--output json`)."""
        result = self.cli(*args, "--output", "json", env=env, timeout=timeout)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return json.loads(result.stdout)

    def add_to_policy(self, folder: Path, **changes: Any) -> None:
        """`pools update` of dev's pool: its policy with `changes`."""
        policy = {**self.json("pools", "get", self.env["POOL"])["policy"], **changes}
        (folder / "policy.json").write_text(json.dumps(policy))
        self.ok("pools", "update", self.env["POOL"], "--policy-file",
                str(folder / "policy.json"))

    def profile_unit(self, node_id: str, name: str) -> dict[str, Any]:
        """A profile unit as `nodes get --query profile` shows it ({} before any report)."""
        profile = self.json("nodes", "get", node_id, "--query", "profile") or {"units": {}}
        found: dict[str, Any] = profile["units"].get(name) or {}
        return found


def start_stack(tmp: Path, *extra: str, env_extra: dict[str, str] | None = None,
                memory: bool = True, port: int | None = None) -> Stack:
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BETTER_COMPUTE",
                                                                     "DATABASE_URL"))}
    env.update(env_extra or {})
    process = subprocess.Popen(
        [sys.executable, "-m", "compute.cli.main", "dev", *(["--memory"] if memory else []),
         "--port", str(port), "--state-dir", str(tmp / "state"), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    deadline = time.monotonic() + 150  # a migration from nothing on a busy machine: ~70 s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError("dev exited early:\n" + "".join(output))
        output.append(line)
        if line.startswith("Ctrl-C stops everything"):
            break
    else:  # stopped as Ctrl-C stops it, so that what it started stops too
        stop_stack(Stack(process, env, output, tmp / "state"))
        raise AssertionError("dev did not become ready:\n" + "".join(output))
    values = read_env_file(tmp / "state" / "env")
    return Stack(process=process, env={**env, **values}, output=output,
                 state_dir=tmp / "state")


def stop_stack(stack: Stack) -> int:
    """Stop `dev` as Ctrl-C does; one that has not stopped within a minute is killed with
    everything it started (each in a session of its own, so not by its process group): a
    stack left running would load the machine under every test after it."""
    stack.process.send_signal(signal.SIGINT)
    try:
        return stack.process.wait(timeout=60)
    finally:
        if stack.process.poll() is None:
            started = psutil.Process(stack.process.pid).children(recursive=True)
            stack.process.kill()
            for child in started:
                with contextlib.suppress(psutil.Error):
                    child.kill()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("dev"), "--sim", "2")
    yield running
    stop_stack(running)


@dataclass(frozen=True)
class Artifacts:
    folder: Path
    digests: dict[str, str]  # {file name: sha256}, as `daemon artifact` printed them


@pytest.fixture(scope="session")
def agent_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """`daemon artifact` run once for the session: the agent's wheel and single-file
    executable (PyInstaller takes a minute on an idle machine, several on a busy one)."""
    folder = tmp_path_factory.mktemp("artifacts")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE")}
    result = subprocess.run(["better-compute", "daemon", "artifact", "--out", str(folder)],
                            env=env, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr
    return Artifacts(folder, {line.split()[0]: line.split()[1]
                              for line in result.stdout.splitlines()})
