"""The test harness cleans up after itself: a test session stopped with SIGTERM (as CI's
time limit or a developer's `kill` stops it) stops its embedded Postgres too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.waiting import wait_until

REPOSITORY = Path(__file__).resolve().parents[1]
PROBE = '''
import os
import time


def test_waits_for_its_end(embedded_postgres):  # the server alone: no database to migrate
    with open(os.environ["PROBE_OUT"], "w") as out:
        out.write(str(embedded_postgres.data_dir))
    time.sleep(300)
'''


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_session_stopped_with_sigterm_stops_its_postgres(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    said = tmp_path / "data-dir"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-c",
         str(REPOSITORY / "pyproject.toml"), str(tmp_path / "test_probe.py")],
        cwd=REPOSITORY, env={**env, "PROBE_OUT": str(said)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: said.exists() and said.read_text(), 120)
        data_dir = Path(said.read_text())
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
        assert alive(postmaster)
        session.send_signal(signal.SIGTERM)
        session.wait(timeout=30)
        assert wait_until(lambda: not alive(postmaster), 30), "Postgres outlived its session"
        assert wait_until(lambda: not data_dir.exists(), 30)  # and its folder went with it
    finally:
        if session.poll() is None:
            session.kill()
