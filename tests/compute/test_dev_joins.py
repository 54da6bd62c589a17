"""`dev` joins its simulated machines all at once: one that does not end in time stops the
others, and none is left running."""

from __future__ import annotations

import socket
from typing import Any

import psutil
import pytest

from compute.cli.client import CliError
from compute.cli.dev import join_simulated


class Minting:
    """The two calls a join needs from the API: a join token and the pins."""

    def call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, str]:
        if method == "joinTokens.create":
            return {"token": "bcjt_never-checked"}
        return {"servingCaSpkiPin": "sha256/AAAA", "joinSigningKeyPin": "sha256/AAAA",
                "joinEncryptionKeyPin": "sha256/AAAA"}


def joins_running() -> list[psutil.Process]:
    return [child for child in psutil.Process().children(recursive=True)
            if "join" in child.cmdline()]


def test_joins_that_hang_are_stopped_at_the_deadline_and_none_is_left(tmp_path):
    silent = socket.socket()  # accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    server = f"http://127.0.0.1:{silent.getsockname()[1]}/api/compute"
    try:
        with pytest.raises(CliError, match="did not join within 3s"):
            join_simulated(Minting(), [tmp_path / "node-01", tmp_path / "node-02"],  # type: ignore[arg-type]
                           variant="gpu", pool_id="pool_x", server=server, env={},
                           timeout=3)
    finally:
        silent.close()
    assert joins_running() == []


def test_a_join_that_fails_says_why(tmp_path):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(CliError, match="could not join"):
        join_simulated(Minting(), [tmp_path / "node-01"],  # type: ignore[arg-type]
                       variant="gpu", pool_id="pool_x",
                       server=f"http://127.0.0.1:{port}/api/compute", env={}, timeout=30)
    assert joins_running() == []


def test_a_machine_that_joins_and_runs_in_one_process_says_why_its_join_failed(tmp_path):
    from compute.cli.dev import Stack, start_joining, until_joined

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    stack = Stack(log_dir=tmp_path / "logs", restart_delay=60)
    try:
        start_joining(stack, Minting(), [tmp_path / "node-01"],  # type: ignore[arg-type]
                      variant="gpu", pool_id="pool_x",
                      server=f"http://127.0.0.1:{port}/api/compute", env={})
        with pytest.raises(CliError, match=r"could not join: bcd join: .*"):
            until_joined(stack, [tmp_path / "node-01"], timeout=30)
    finally:
        stack.stop()
    assert "--run" in stack.specs[stack.children[0].pid][0]
    assert joins_running() == []
