"""Talking to QEMU's guest agent (qemu-ga) in a sandbox, over its virtio-serial port.

The port's host end is a socket in the VM's folder; one client at a time may hold it, so
each exchange takes the VM's lock, connects, resynchronises (`guest-sync-delimited`: the
agent answers after a 0xFF byte, which skips whatever an earlier client left half-read),
sends one command and reads its answer.

A command runs under `/bin/setsid` in a shell of its own process group, its output going to
files in the guest (`/run/bc-exec/<pid>.out` and `.err`), so that it can be read while it
runs (`--follow`) and after the agent that started it died; a timer in that shell kills the
whole group when the time limit passes, whether or not anyone on the host still watches.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from bcd.qemu import VmFiles

OUTPUT_DIR = "/run/bc-exec"
READ_CHUNK = 1 << 20
# The shell a command runs in: the command in the background with its output to files, a
# timer that kills the shell's process group at the limit, the command's status as its own.
WRAPPER = ('d=' + OUTPUT_DIR + '; t=$1; shift; "$@" </dev/null >"$d/$$.out" 2>"$d/$$.err" & '
           'c=$!; (sleep "$t"; kill -KILL -$$) >/dev/null 2>&1 & s=$!; wait $c; r=$?; '
           'kill $s 2>/dev/null; exit $r')
_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


class GuestAgentError(RuntimeError):
    """The guest agent did not answer, or answered with an error; the message says which."""


def _lock(files: VmFiles) -> threading.Lock:
    with _locks_lock:
        return _locks.setdefault(str(files.folder), threading.Lock())


def call(files: VmFiles, execute: str, arguments: dict[str, Any] | None = None, *,
         timeout: float = 10.0) -> Any:
    """One guest agent command; its `return` value."""
    request: dict[str, Any] = {"execute": execute}
    if arguments is not None:
        request["arguments"] = arguments
    with _lock(files):
        folder = os.open(files.folder, os.O_PATH)  # the socket's path may exceed 108 bytes
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(timeout)
                sock.connect(f"/proc/self/fd/{folder}/{files.agent.name}")
                return _exchange(sock, request)
        except OSError as error:
            raise GuestAgentError(f"the guest agent did not answer ({execute}): {error}; "
                                  "does the image run qemu-guest-agent?") from None
        finally:
            os.close(folder)


def _exchange(sock: socket.socket, request: dict[str, Any]) -> Any:
    token = secrets.randbelow(1 << 31)
    sock.sendall(b"\xff" + json.dumps({"execute": "guest-sync-delimited",
                                      "arguments": {"id": token}}).encode() + b"\n")
    reader = sock.makefile("rb")
    for _ in range(16):  # answers a client before us left unread, its own syncs' among them
        while (byte := reader.read(1)) not in (b"\xff", b""):
            pass
        if not byte:
            break
        with contextlib.suppress(ValueError):
            if json.loads(reader.readline() or b"{}").get("return") == token:
                break
    else:
        raise GuestAgentError("the guest agent did not resynchronise")
    if not byte:
        raise GuestAgentError("the guest agent closed its channel")
    sock.sendall(json.dumps(request).encode() + b"\n")
    answer = json.loads(reader.readline() or b"{}")
    if "error" in answer:
        desc = answer["error"].get("desc", answer["error"])
        raise GuestAgentError(f"{request['execute']}: {desc}")
    if "return" not in answer:
        raise GuestAgentError(f"{request['execute']}: no answer")
    return answer["return"]


def ready(files: VmFiles, *, timeout: float = 2.0) -> bool:
    """Whether the guest agent answers."""
    try:
        call(files, "guest-ping", timeout=timeout)
    except GuestAgentError:
        return False
    return True


def exec_start(files: VmFiles, argv: list[str], *, limit: float) -> int:
    """Start `argv` in the guest with a time limit of `limit` seconds; its pid there."""
    started = call(files, "guest-exec", {
        "path": "/bin/setsid",
        "arg": ["/bin/sh", "-c", WRAPPER, "sh", f"{limit:g}", *argv]})
    return int(started["pid"])


@dataclass(frozen=True)
class ExecStatus:
    exited: bool
    exit_code: int | None
    signal: int | None


def exec_status(files: VmFiles, pid: int) -> ExecStatus:
    """Whether the command has ended, and how. The agent forgets a command once it told
    that it ended: ask again after that and it answers with an error."""
    said = call(files, "guest-exec-status", {"pid": pid})
    return ExecStatus(bool(said.get("exited")), said.get("exitcode"), said.get("signal"))


def output_paths(pid: int) -> tuple[str, str]:
    return f"{OUTPUT_DIR}/{pid}.out", f"{OUTPUT_DIR}/{pid}.err"


def read_file(files: VmFiles, path: str, *, offset: int = 0, limit: int = READ_CHUNK
              ) -> tuple[bytes, bool]:
    """Up to `limit` bytes of a guest file from `offset`, and whether its end was reached."""
    handle = call(files, "guest-file-open", {"path": path, "mode": "r"})
    try:
        if offset:
            call(files, "guest-file-seek", {"handle": handle, "offset": offset, "whence": "set"})
        data, eof = b"", False
        while len(data) < limit and not eof:
            chunk = call(files, "guest-file-read",
                         {"handle": handle, "count": min(READ_CHUNK, limit - len(data))})
            data += base64.b64decode(chunk.get("buf-b64", ""))
            eof = bool(chunk.get("eof")) or not chunk.get("count")
        return data, eof
    finally:
        with contextlib.suppress(GuestAgentError):
            call(files, "guest-file-close", {"handle": handle})


def write_file(files: VmFiles, path: str, data: bytes) -> None:
    handle = call(files, "guest-file-open", {"path": path, "mode": "w"})
    try:
        for start in range(0, len(data), READ_CHUNK):
            piece = data[start:start + READ_CHUNK]
            call(files, "guest-file-write",
                 {"handle": handle, "buf-b64": base64.b64encode(piece).decode()})
    finally:
        call(files, "guest-file-close", {"handle": handle})


def file_size(files: VmFiles, path: str) -> int:
    """A guest file's size (by seeking to its end)."""
    handle = call(files, "guest-file-open", {"path": path, "mode": "r"})
    try:
        return int(call(files, "guest-file-seek",
                        {"handle": handle, "offset": 0, "whence": "end"})["position"])
    finally:
        with contextlib.suppress(GuestAgentError):
            call(files, "guest-file-close", {"handle": handle})


def run_quietly(files: VmFiles, argv: list[str], *, timeout: float = 10.0) -> None:
    """Run a short housekeeping command in the guest and reap it (its output unread)."""
    pid = int(call(files, "guest-exec", {"path": argv[0], "arg": argv[1:]})["pid"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not exec_status(files, pid).exited:
        time.sleep(0.05)
