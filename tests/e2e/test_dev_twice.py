"""`better-compute dev` run a second time on the state folder of one that runs: it refuses
at once, names the running one, and touches nothing of it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.e2e.conftest import start_stack, stop_stack
from tests.support.processes import free_port

KEPT = ("admin-token", "gateway-ports.json", "env", "sim/node-01/etc/bcd/config.toml",
        "sim/node-01/etc/bcd/node-key.pem")


def test_a_second_dev_on_the_same_state_refuses_and_touches_nothing(tmp_path):
    first = start_stack(tmp_path, "--sim", "1")
    try:
        state = tmp_path / "state"
        before = {name: (state / name).read_bytes() for name in KEPT}
        [node] = [n for n in first.json("nodes", "list")["items"] if n["role"] == "node"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE")}
        second = subprocess.run(
            [sys.executable, "-m", "compute.cli.main", "dev", "--memory", "--sim", "1",
             "--port", str(free_port()), "--state-dir", str(state)],
            env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        said = second.stderr
        assert f"pid {first.process.pid}" in said, said
        assert first.env["BETTER_COMPUTE_URL"] in said
        assert "--state-dir" in said
        assert "Traceback" not in said
        assert "starting embedded Postgres" not in second.stdout + said  # refused first
        assert {name: (state / name).read_bytes() for name in KEPT} == before
        [same] = [n for n in first.json("nodes", "list")["items"] if n["role"] == "node"]
        assert (same["id"], same["connectivity"], same["sessionEpoch"]) == (
            node["id"], "connected", node["sessionEpoch"])
    finally:
        assert stop_stack(first) == 0
    again = start_stack(tmp_path, "--sim", "1")  # the lock went with the first
    assert stop_stack(again) == 0
