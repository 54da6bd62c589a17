"""`better-compute dev` starts and stops cleanly, leaving no process behind."""

from __future__ import annotations

import subprocess

from tests.e2e.conftest import start_stack, stop_stack


def processes_mentioning(text: str) -> list[str]:
    listing = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True,
                             check=True).stdout
    return [line for line in listing.splitlines() if text in line and "ps -eww" not in line]


def test_dev_stops_every_process_it_started(tmp_path):
    stack = start_stack(tmp_path, "--sim", "1", "--sim-variant", "cpu")
    try:
        data_dir = next(line.split(" in ")[1].split(" ")[0] for line in stack.output
                        if "starting embedded Postgres" in line)
        port = stack.env["BETTER_COMPUTE_URL"].split(":")[2].split("/")[0]
        assert processes_mentioning(data_dir)
        assert processes_mentioning(f"-p {port} ")
        assert stack.env["CPU_POOL"].startswith("pool_")
    finally:
        assert stop_stack(stack) == 0
    assert processes_mentioning(data_dir) == []
    assert processes_mentioning(f"-p {port} ") == []
