"""The control plane's systemd units (deploy/systemd): systemd itself reads them without a
warning, rates them well hardened, and each command they run exists in this install."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "deploy" / "systemd"
pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="needs systemd-analyze")


@pytest.fixture
def installed(tmp_path) -> Path:
    """The units as they would be installed: this interpreter for /opt/better-compute's,
    the example environment file for /etc/better-compute/env."""
    (tmp_path / "env").write_text((UNITS / "env.example").read_text())
    for unit in UNITS.glob("*.service"):
        text = (unit.read_text().replace("/opt/better-compute/bin/python", sys.executable)
                .replace("/etc/better-compute/env", str(tmp_path / "env")))
        (tmp_path / unit.name.replace("@.", "@1.")).write_text(text)
    return tmp_path


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_every_unit_verifies_cleanly_and_is_hardened(installed):
    units = sorted(str(p) for p in installed.glob("*.service"))
    assert len(units) == 4
    verified = analyze("verify", "--man=no", *units)
    assert (verified.returncode, verified.stdout + verified.stderr) == (0, "")
    for unit in units:
        rated = analyze("security", "--offline=yes", "--threshold=20", unit)
        assert rated.returncode == 0, rated.stdout[-600:]
        assert "OK" in rated.stdout.splitlines()[-1], rated.stdout.splitlines()[-1]


def test_a_bad_key_is_caught(installed):
    unit = installed / "better-compute-api.service"
    unit.write_text(unit.read_text().replace("[Service]\n", "[Service]\nRestartt=always\n"))
    verified = analyze("verify", "--man=no", str(unit))
    assert "Unknown key" in verified.stderr


def test_each_unit_runs_a_command_this_install_has(installed):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "compute.project.settings"}
    for unit in installed.glob("*.service"):
        for line in unit.read_text().splitlines():
            if line.startswith(("ExecStart=", "ExecStartPre=")):
                argv = shlex.split(line.split("=", 1)[1])
                assert argv[0] == sys.executable, line
                assert argv[1] == "-m", line
                head = argv[:3] if argv[2] != "django" else argv[:4]
                shown = subprocess.run([*head, "--help"], capture_output=True, text=True,
                                       env=env, timeout=120, check=False)
                assert shown.returncode == 0, (line, shown.stderr[-600:])
