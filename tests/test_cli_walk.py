"""Every command of the CLI, run on a machine without its optional tools (no programs on
PATH, none of the optional Python modules) against a control plane that does not answer:
each ends in a one-line error or a usage message, never in a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from compute.cli.main import cli

REPOSITORY = Path(__file__).resolve().parents[1]
# Commands that run until stopped: each has its own end-to-end test.
LONG_RUNNING = {"dev", "serve", "workers", "gateway", "mcp", "sim run"}
OPTIONAL_MODULES = ("PyInstaller", "pynvml", "libvirt", "playwright")
VALUES = {"sha256": "amd64=" + "0" * 64, "bcd_version": "0.2.0", "quota": "gpu=1",
          "base_url": "https://compute.example.com", "gateway_url": "grpcs://gw.example.com:1",
          "bmc": "redfish+https://10.9.0.1/redfish/v1/Systems/1", "deploy_url":
          "http://10.9.0.2:8080/v1/deploy", "method": "system.whoami"}


def leaves(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from leaves(command, (*prefix, name))
        elif " ".join((*prefix, name)) not in LONG_RUNNING:
            yield (*prefix, name)


def command_of(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def value_for(param: click.Parameter, folder: Path) -> str:
    """A value of the parameter's type that parses: an existing file where one is read."""
    kind = param.type
    given = VALUES.get(param.name or "")
    if given:
        return given
    if isinstance(kind, click.Path | click.File):
        reads = (isinstance(kind, click.File) and "r" in kind.mode) or getattr(
            kind, "exists", False)
        return str(folder / "input.json") if reads else str(folder / f"out-{param.name}")
    if isinstance(kind, click.Choice):
        return str(kind.choices[0])
    if isinstance(kind, click.IntRange | click.FloatRange):
        return str(kind.min if kind.min is not None else 1)
    if isinstance(kind, click.types.IntParamType | click.types.FloatParamType):
        return "1"
    if type(kind).__name__ == "Duration":
        return "1h"
    return "x"


def argv_for(path: tuple[str, ...], folder: Path) -> list[str]:
    args: list[str] = []
    for param in command_of(path).params:
        if not param.required:
            continue
        value = value_for(param, folder)
        if isinstance(param, click.Option):
            args += [param.opts[0], value]
        else:
            args.append(value)
    return args


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A folder with an input file, and an environment without optional tools."""
    folder = tmp_path_factory.mktemp("walk")
    (folder / "input.json").write_text("{}")
    (folder / "token").write_text(f"biam_tok_{'0' * 26}.{'x' * 32}\n")  # well formed
    (folder / "token").chmod(0o600)
    hidden = folder / "hidden"
    for module in OPTIONAL_MODULES:  # each import fails, as when it is not installed
        (hidden / module).mkdir(parents=True)
        (hidden / module / "__init__.py").write_text(f"raise ImportError('No module named "
                                                     f"{module}')\n")
    (folder / "bin").mkdir()  # no programs at all
    env = {"PATH": str(folder / "bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "PYTHONPATH": f"{hidden}{os.pathsep}{REPOSITORY}",
           "BETTER_COMPUTE_URL": "http://127.0.0.1:9/api/compute",
           "BETTER_COMPUTE_TOKEN_FILE": str(folder / "token"),
           "BETTER_COMPUTE_HOME": str(folder / "home")}
    return folder, env


@pytest.mark.parametrize("path", [" ".join(p) for p in leaves(cli)])
def test_no_command_ends_in_a_traceback(path, bare):
    folder, env = bare
    words = tuple(path.split())
    done = subprocess.run([sys.executable, "-m", "compute.cli.main", *words,
                           *argv_for(words, folder)], env=env, cwd=folder,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    said = done.stdout + done.stderr
    assert "Traceback" not in said, said
    if done.returncode not in (0, 2):  # 2: a usage error or a refusal, said as such
        assert done.stderr.strip().splitlines()[-1].startswith("error: "), said


def test_the_walk_covers_the_commands_that_need_tools():
    walked = {" ".join(p) for p in leaves(cli)}
    assert {"daemon artifact", "images deploy-ramdisk", "audit check-proof"} <= walked
    assert len(walked) >= 70
