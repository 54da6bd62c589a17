"""`better-compute dev --memory --sim 8`: ready quickly, and stops every process it started."""

from __future__ import annotations

import re
import subprocess

import psycopg
import pytest

from tests.e2e.conftest import start_stack, stop_stack


def processes_mentioning(text: str) -> list[str]:
    listing = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True,
                             check=True).stdout
    return [line for line in listing.splitlines() if text in line and "ps -eww" not in line]


def environment_of(pid: int) -> set[str]:
    """The names in a process's environment."""
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return {entry.split(b"=", 1)[0].decode() for entry in handle.read().split(b"\0")
                if entry}


def test_dev_with_eight_simulated_agents_comes_up_and_stops_cleanly(tmp_path):
    """(How fast is a figure for a benchmark, not a test: these machines are shared.)"""
    stack = start_stack(tmp_path, "--sim", "8")
    try:
        assert "8 simulated node(s) adopted and connected" in "".join(stack.output)
        [ready] = [line for line in stack.output if line.startswith("ready in ")]
        assert re.fullmatch(r"ready in \d+\.\d s with 8 simulated machine\(s\) \(load "
                            r"average \d+\.\d on \d+ cores\)\n", ready), ready
        data_dir = next(line.split(" in ")[1].split()[0] for line in stack.output
                        if "embedded Postgres runs in" in line)
        state = str(tmp_path / "state")
        assert processes_mentioning(data_dir)
        assert len(processes_mentioning(f"{state}/sim/")) == 1  # one bcd runs every machine
        machines = sorted((tmp_path / "state" / "sim").iterdir())
        assert len(machines) == 8
        assert all((m / "etc/bcd/node-cert.pem").exists() for m in machines)  # each its own
        assert processes_mentioning("-m gateway")
        logs = tmp_path / "state" / "logs"  # every process's output, where dev says
        assert f"{logs}/<name>.log" in "".join(stack.output)
        assert {"api.log", "gateway.log", "worker-1.log", "sim-node-01.log",
                "sim-node-08.log"} <= {p.name for p in logs.iterdir()}
        assert "connected as node_" in (logs / "sim-node-08.log").read_text()  # its own lines
        for line in processes_mentioning(f"{state}/sim/"):  # an agent speaks to the gateway
            names = environment_of(int(line.split()[0]))
            assert "DATABASE_URL" not in names
            assert {name for name in names if name.startswith("BETTER_COMPUTE_")} <= {
                "BETTER_COMPUTE_PROCESS"}  # its name in dev's supervisor, and no secret
        superuser = stack.env["DATABASE_URL"]
        assert ":" in superuser.split("@")[0].removeprefix("postgresql://")  # a password
        no_password = superuser.replace(superuser.split("@")[0], "postgresql://postgres")
        for url in (no_password, superuser.replace("@", "x@", 1)):
            with pytest.raises(psycopg.OperationalError, match="password"):
                psycopg.connect(url, connect_timeout=5)
    finally:
        assert stop_stack(stack) == 0
    assert processes_mentioning(data_dir) == []
    assert processes_mentioning(state) == []
    assert not (tmp_path / "state" / "env").exists()  # it named a server that is gone


def test_cpu_variant_gives_a_cpu_pool_of_machines_without_gpus(tmp_path):
    stack = start_stack(tmp_path, "--sim", "1", "--sim-variant", "cpu")
    try:
        cpu_pool = stack.env["CPU_POOL"]
        assert stack.ok("capacity", "--pool", cpu_pool, "--query", "vcpu.allocatable") == "32"
        assert stack.ok("capacity", "--pool", cpu_pool, "--query", "gpu.total") == "0"
    finally:
        assert stop_stack(stack) == 0
