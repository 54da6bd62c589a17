"""Commands that act inside a sandbox's guest: run a command, read its output, put and get
files. Each reaches the guest through QEMU's guest agent (bcd.guest).

`vm.exec` is a one-shot command like any other (journaled, run at most once): once the
guest has started it, its pid there is journaled, so an agent killed while it runs waits
for that same run when the command is delivered again and reports its result, once. The
reads (`vm.exec-read`, `vm.get`) change nothing and are simply answered.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import time
from collections.abc import Callable
from typing import Any

from bcd import guest, qemu
from bcd.config import Paths
from bcd.contract import ids
from bcd.contract.vms import FILE_LIMIT

OUTPUT_LIMIT = 1 << 20  # bytes of each stream a finished command returns at most
MAX_SECONDS = 3600.0
Result = tuple[str, dict[str, Any]]


class BadRequest(ValueError):
    """A payload that is not a well-formed request; the message says what is wrong."""


def _files(paths: Paths, payload: dict[str, Any]) -> qemu.VmFiles:
    try:
        sandbox = ids.parse(payload.get("sandboxId"), expect="sbx")
    except ids.InvalidId as error:
        raise BadRequest(str(error)) from None
    files = qemu.VmFiles.of(paths, sandbox)
    if qemu.running_pid(files) is None:
        raise BadRequest(f"sandbox {sandbox} has no VM running on this node")
    return files


def _argv(payload: dict[str, Any]) -> list[str]:
    argv = payload.get("argv")
    if (not isinstance(argv, list) or not argv or len(argv) > 1024
            or not all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise BadRequest("argv must be a list of 1 to 1024 strings without NUL")
    return argv


def _seconds(payload: dict[str, Any]) -> float:
    limit = payload.get("timeoutSeconds", 60)
    if not isinstance(limit, (int, float)) or isinstance(limit, bool) or not (
            0 < limit <= MAX_SECONDS):
        raise BadRequest(f"timeoutSeconds must be a number from 0 to {MAX_SECONDS:.0f}")
    return float(limit)


def _guest_path(payload: dict[str, Any]) -> str:
    path = payload.get("path")
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path \
            or len(path) > 1024:
        raise BadRequest("path must be an absolute guest path of at most 1024 characters")
    return path


def answering(action: Callable[[], Result]) -> Result:
    """`action`'s result, or `failed` saying why when the request or the guest is wrong."""
    try:
        return action()
    except BadRequest as error:
        return "failed", {"error": str(error)}
    except guest.GuestAgentError as error:
        return "failed", {"error": str(error)}


def exec_start(paths: Paths, payload: dict[str, Any],
               started: Callable[[int, float], None]) -> Result:
    """Start the command; `started(pid, deadline)` journals it before anything waits. A
    detached command answers at once with its pid; otherwise its end is waited for."""
    files, argv, limit = _files(paths, payload), _argv(payload), _seconds(payload)
    pid = guest.exec_start(files, argv, limit=limit)
    deadline = time.time() + limit
    started(pid, deadline)
    if payload.get("detach"):
        return "succeeded", {"pid": pid, "detached": True}
    return exec_finish(paths, payload, pid, deadline)


def exec_finish(paths: Paths, payload: dict[str, Any], pid: int, deadline: float) -> Result:
    """Wait for a started command (the guest kills it at its deadline), then its output."""
    files = _files(paths, payload)
    pause = 0.02
    while not (status := guest.exec_status(files, pid)).exited:
        if time.time() > deadline + 30:  # the guest's own timer has not fired: say so
            return "failed", {"error": f"the command (pid {pid}) outlived its time limit"}
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)
    output: dict[str, Any] = {"pid": pid, "exitCode": exit_code(status),
                              "signal": status.signal,
                              "timedOut": status.signal == 9 and time.time() >= deadline - 0.5}
    for name, path in zip(("stdout", "stderr"), guest.output_paths(pid), strict=True):
        data, complete = guest.read_file(files, path, limit=OUTPUT_LIMIT)
        output[name] = data.decode(errors="replace")
        output[f"{name}Truncated"] = not complete
    with contextlib.suppress(guest.GuestAgentError):
        guest.run_quietly(files, ["/bin/rm", "-f", *guest.output_paths(pid)])
    return "succeeded", output


def exit_code(status: guest.ExecStatus) -> int | None:
    """The command's exit code, or 128 + the signal that killed it, as a shell says."""
    if status.exit_code is not None:
        return status.exit_code
    return 128 + status.signal if status.signal else None


def exec_read(paths: Paths, payload: dict[str, Any]) -> Result:
    """A detached command's output from the offsets given, and whether it has ended (its
    output files are removed once it ended and was read to the end)."""
    files = _files(paths, payload)
    pid, offsets = payload.get("pid"), (payload.get("stdoutOffset", 0),
                                        payload.get("stderrOffset", 0))
    if not isinstance(pid, int) or pid <= 0 or not all(
            isinstance(o, int) and o >= 0 for o in offsets):
        raise BadRequest("pid and the offsets must be non-negative integers")
    try:
        status = guest.exec_status(files, pid)
    except guest.GuestAgentError:  # told before that it ended: the agent forgot it
        status = guest.ExecStatus(True, payload.get("exitCode"), None)
    output: dict[str, Any] = {"pid": pid, "exited": status.exited}
    complete = True
    for name, path, offset in zip(("stdout", "stderr"), guest.output_paths(pid), offsets,
                                  strict=True):
        try:
            data, eof = guest.read_file(files, path, offset=offset, limit=OUTPUT_LIMIT // 4)
        except guest.GuestAgentError:  # removed: everything was read
            data, eof = b"", True
        output[name] = base64.b64encode(data).decode()
        output[f"{name}Offset"] = offset + len(data)
        complete = complete and eof
    if status.exited:
        output.update(exitCode=exit_code(status), signal=status.signal)
        if complete:
            with contextlib.suppress(guest.GuestAgentError):
                guest.run_quietly(files, ["/bin/rm", "-f", *guest.output_paths(pid)])
    return "succeeded", output


def put(paths: Paths, payload: dict[str, Any]) -> Result:
    files, path = _files(paths, payload), _guest_path(payload)
    try:
        data = base64.b64decode(str(payload.get("data", "")), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("data must be base64") from None
    if len(data) > FILE_LIMIT:
        raise BadRequest(f"a file of {len(data)} bytes is above {FILE_LIMIT}")
    guest.write_file(files, path, data)
    return "succeeded", {"path": path, "bytes": len(data)}


def get(paths: Paths, payload: dict[str, Any]) -> Result:
    files, path = _files(paths, payload), _guest_path(payload)
    limit = payload.get("limit", FILE_LIMIT)
    if not isinstance(limit, int) or not 0 < limit <= FILE_LIMIT:
        raise BadRequest(f"limit must be an integer from 1 to {FILE_LIMIT}")
    size = guest.file_size(files, path)
    if size > limit:
        return "failed", {"error": f"{path} is {size} bytes, above the limit of {limit}"}
    data, _ = guest.read_file(files, path, limit=limit)
    return "succeeded", {"path": path, "bytes": len(data),
                         "data": base64.b64encode(data).decode()}
