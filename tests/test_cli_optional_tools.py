"""A command that needs an optional tool which is not installed says what to install, in one
line, and writes nothing; it never ends in a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def test_daemon_artifact_without_pyinstaller_names_the_extra_and_writes_nothing(tmp_path):
    hidden = tmp_path / "hidden" / "PyInstaller"  # as if PyInstaller were not installed
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named PyInstaller')\n")
    env = {**os.environ, "PYTHONPATH": f"{hidden.parent}{os.pathsep}{REPOSITORY}"}
    out = tmp_path / "downloads"
    done = subprocess.run([sys.executable, "-m", "compute.cli.main", "daemon", "artifact",
                           "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "better-compute[artifacts]" in done.stderr, done.stderr
    assert "--wheel-only" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()
    wheel_only = subprocess.run([sys.executable, "-m", "compute.cli.main", "daemon",
                                 "artifact", "--out", str(out), "--wheel-only"], env=env,
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert wheel_only.returncode == 0, wheel_only.stderr
    assert [p.suffix for p in out.iterdir()] == [".whl"]
