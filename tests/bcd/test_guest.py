"""The guest agent's channel: a client starts after another died mid-exchange."""

from __future__ import annotations

import json
import socket
import threading

from bcd.guest import _exchange


def agent(sock: socket.socket, stale: bytes) -> None:
    """QEMU's guest agent as the channel shows it: what the dead client left unread first,
    then the answers to the new client's sync and command."""
    sock.sendall(stale)
    reader = sock.makefile("rb")
    sync = json.loads(reader.readline().lstrip(b"\xff"))
    sock.sendall(b"\xff" + json.dumps({"return": sync["arguments"]["id"]}).encode() + b"\n")
    json.loads(reader.readline())
    sock.sendall(b'{"return": {"pid": 42}}\n')


def test_answers_a_dead_client_left_unread_are_skipped_its_sync_answer_among_them():
    ours, theirs = socket.socketpair()
    stale = b'{"return": {"exited": false}}\n\xff{"return": 12345}\n'  # the dead client's
    thread = threading.Thread(target=agent, args=(theirs, stale))
    thread.start()
    with ours:
        ours.settimeout(5)
        assert _exchange(ours, {"execute": "guest-exec"}) == {"pid": 42}
    thread.join(5)
    theirs.close()
