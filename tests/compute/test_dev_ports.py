"""`dev` holds the ports it chose until its servers listen on them: a port chosen before a
minute of migrations is not taken meanwhile by another program's free port or outgoing
connection, and a server that cannot start says why."""

import json
import socket
import sys

import pytest

from compute.cli.client import CliError
from compute.cli.dev import Stack, _gateway_ports, _release, _wait_for_port, hold_port

HOST = "127.0.0.1"


def bind_plain(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def test_a_held_port_is_taken_by_no_one_else_yet_its_server_binds_it():
    holder = hold_port(HOST)
    port = holder.getsockname()[1]
    try:
        assert not bind_plain(port)  # another program's bind (or connect) does not get it
        with socket.socket() as server:  # as gunicorn and gRPC bind: reusing the address
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((HOST, port))
            server.listen()
            with socket.create_connection((HOST, port), timeout=2):
                pass
    finally:
        holder.close()
    assert bind_plain(port)


def test_a_port_someone_listens_on_is_not_held():
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen()
        assert hold_port(HOST, listener.getsockname()[1]) is None


def test_the_gateway_ports_are_the_last_runs_while_free_and_held_until_released(tmp_path):
    pairs, holders = _gateway_ports(tmp_path, HOST, count=2)
    kept = json.loads((tmp_path / "gateway-ports.json").read_text())
    assert [(kept["sessions"], kept["joins"]), *map(tuple, kept["more"])] == pairs
    assert all(not bind_plain(port) for pair in pairs for port in pair)
    _release(holders)

    again, holders = _gateway_ports(tmp_path, HOST, count=2)
    assert again == pairs
    _release(holders)

    with socket.socket() as squatter:  # one of them is taken meanwhile: all are chosen anew
        squatter.bind((HOST, pairs[1][0]))
        squatter.listen()
        fresh, holders = _gateway_ports(tmp_path, HOST, count=2)
        _release(holders)
    assert pairs[1][0] not in {port for pair in fresh for port in pair}
    assert json.loads((tmp_path / "gateway-ports.json").read_text())["sessions"] == fresh[0][0]


def test_a_server_that_exits_before_listening_says_why(tmp_path):
    stack = Stack(log_dir=tmp_path)
    stack.start([sys.executable, "-c", "import sys; print('starting', flush=True); "
                 "sys.exit('RuntimeError: Failed to bind to address')"], {}, name="gateway")
    try:
        with pytest.raises(CliError, match="gateway exited early: RuntimeError: Failed to bind"):
            _wait_for_port(HOST, 9, stack, "gateway", "gateway")
    finally:
        stack.stop()
