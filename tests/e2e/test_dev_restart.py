"""`better-compute dev` run again on the state it kept: the same machines come back with a
live session, whether the gateway got its old port back or had to take a new one."""

from __future__ import annotations

import contextlib
import json
import socket
import threading

from bcd.config import Config, Paths
from tests.e2e.conftest import Stack, free_port, start_stack, stop_stack
from tests.support.waiting import wait_until


def hang_up_on_everyone(listener: socket.socket) -> None:
    with contextlib.suppress(OSError):  # until the listener closes
        while True:
            listener.accept()[0].close()


def nodes(stack: Stack) -> list[dict]:
    """The simulated machines (not dev's provisioner)."""
    return [n for n in stack.json("nodes", "list")["items"] if n["role"] == "node"]


def test_a_restart_on_kept_state_reconnects_the_same_machines(tmp_path):
    home = {"BETTER_COMPUTE_HOME": str(tmp_path / "home")}  # its own database, kept
    api_port = free_port()  # the address the agents joined through stays
    agent_config = Paths(tmp_path / "state" / "sim" / "node-01").config_file
    ports_file = tmp_path / "state" / "gateway-ports.json"

    first = start_stack(tmp_path, "--sim", "1", env_extra=home, memory=False,
                        port=api_port)
    try:
        [node] = nodes(first)
        epoch = node["sessionEpoch"]
        ports = json.loads(ports_file.read_text())
    finally:
        assert stop_stack(first) == 0

    again = start_stack(tmp_path, "--sim", "1", env_extra=home, memory=False,
                        port=api_port)
    try:
        assert "1 simulated node(s) adopted and connected" in "".join(again.output)
        assert json.loads(ports_file.read_text()) == ports  # the agent's address still holds
        [same] = nodes(again)
        assert (same["id"], same["connectivity"]) == (node["id"], "connected")
        assert same["sessionEpoch"] > epoch
        epoch = same["sessionEpoch"]
    finally:
        assert stop_stack(again) == 0

    with socket.socket() as squatter:  # another program took the gateway's port meanwhile
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", ports["sessions"]))
        squatter.listen()
        threading.Thread(target=hang_up_on_everyone, args=(squatter,), daemon=True).start()
        moved = start_stack(tmp_path, "--sim", "1", env_extra=home, memory=False,
                            port=api_port)
        try:
            assert "1 simulated node(s) adopted and connected" in "".join(moved.output)
            new_port = json.loads(ports_file.read_text())["sessions"]
            assert new_port != ports["sessions"]
            [same] = nodes(moved)
            assert (same["id"], same["connectivity"]) == (node["id"], "connected")
            assert same["sessionEpoch"] > epoch
            # The agent followed the address the control plane publishes, and kept it.
            assert Config.read(agent_config).gateway == f"127.0.0.1:{new_port}"
            assert "moving from" in (tmp_path / "state" / "logs" / "sim-node-01.log").read_text()
        finally:
            assert stop_stack(moved) == 0


def test_memory_runs_again_on_the_same_state_with_new_machines_and_a_spare_cluster(tmp_path):
    """A new throw-away database knows none of the machines the last `--memory` run joined:
    they join again as new ones. The run left a spare copy of the migrated cluster, which
    the next one takes instead of copying."""
    from compute.core import pg

    home = {"BETTER_COMPUTE_HOME": str(tmp_path / "home")}
    first = start_stack(tmp_path, "--sim", "1", env_extra=home)
    try:
        [node] = nodes(first)
        [copy] = [d for d in (tmp_path / "home" / "migrated").iterdir() if "." not in d.name]
        assert wait_until(lambda: pg.spare_of(copy).exists(), 60)  # made once it was ready
    finally:
        assert stop_stack(first) == 0
    spare = pg.spare_of(copy).stat().st_ino
    again = start_stack(tmp_path, "--sim", "1", env_extra=home)
    try:
        running = [d.stat().st_ino for d in (tmp_path / "home" / "tmp").glob("pg-*")]
        assert running == [spare]  # the spare itself, renamed into place
        [new] = nodes(again)
        assert new["id"] != node["id"]
        assert (new["connectivity"], new["provisionState"]) == ("connected", "adopted")
        assert wait_until(lambda: pg.spare_of(copy).exists(), 60)  # taken, then made again
    finally:
        assert stop_stack(again) == 0


def test_term_while_starting_stops_what_had_started(tmp_path):
    """A TERM before the stack is ready (a service manager giving up, a script) stops the
    processes already started and the database, as Ctrl-C does: none is left behind."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    env = {k: v for k, v in os.environ.items() if not k.startswith(("BETTER_COMPUTE",
                                                                     "DATABASE_URL"))}
    env["BETTER_COMPUTE_HOME"] = str(tmp_path / "home")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "compute.cli.main", "dev", "--memory", "--sim", "1", "--port",
         str(port), "--state-dir", str(tmp_path / "state")], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)

    def ours() -> list[psutil.Process]:
        found = []
        for other in psutil.process_iter(["cmdline"]):
            line = " ".join(other.info["cmdline"] or [])
            if other.pid != process.pid and (str(tmp_path) in line or f":{port}" in line):
                found.append(other)
        return found

    try:
        for line in process.stdout:
            if "embedded Postgres runs" in line:
                break
        # the database, the API (started after the migrations: ~70 s on a busy machine)
        assert wait_until(lambda: len(ours()) >= 2, 150)
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        assert wait_until(lambda: not ours(), 30), [p.info["cmdline"] for p in ours()]
    finally:
        process.kill()
        for other in ours():
            other.kill()
