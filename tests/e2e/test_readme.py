"""The tutorial page runs as written against `dev`: its `sh` blocks, extracted from the page
itself, run top to bottom in one shell, so the tutorial cannot drift from what works."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from compute.cli.dev import JOIN_ONE_MORE
from tests.e2e.conftest import start_stack, stop_stack

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
DEV_ENV = "/var/lib/better-compute/dev/env"  # dev's default; this test gives dev its own dir


def tutorial_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", TUTORIAL.read_text(), flags=re.S)


@pytest.mark.timeout(900)  # (a few minutes alone; several more on two busy cores)
def test_the_tutorial_runs_as_written_against_dev(tmp_path):
    blocks = tutorial_blocks()
    assert len(blocks) >= 6
    assert DEV_ENV in blocks[0]
    work = tmp_path / "tutorial"
    work.mkdir()
    stack = start_stack(tmp_path, "--sim", "2")
    script = "set -eu\n" + "\n".join(blocks).replace(DEV_ENV, str(tmp_path / "state" / "env"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE")}
    try:
        result = subprocess.run(["bash", "-c", script], cwd=work, env=clean, text=True,
                                capture_output=True, timeout=600, check=False)
        assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-6000:])
        assert "proof verifies" in result.stdout
        assert (work / "machine-1" / "etc/bcd/config.toml").exists()
        printed = "".join(stack.output)  # dev prints the same join command
        for line in JOIN_ONE_MORE.splitlines():
            assert line.strip() in printed, line
            assert line.strip() in TUTORIAL.read_text(), line
    finally:
        subprocess.run(["pkill", "-f", "machine-1 node"], check=False)  # the agent it started
        assert stop_stack(stack) == 0
