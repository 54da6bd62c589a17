"""systemd's service notifications (sd_notify), for `Type=notify` and `WatchdogSec=`: the
agent says READY once it serves, pings the watchdog from its event loop (so a hung loop gets
it restarted) and says STOPPING on the way out. Without systemd, nothing is sent."""

from __future__ import annotations

import os
import socket

from bcd.config import VARIABLES


def sd_notify(state: str) -> bool:
    """Send `state` (such as READY=1) to $NOTIFY_SOCKET; False when there is none."""
    address = VARIABLES.text("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # the abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def watchdog_seconds() -> float | None:
    """How often to ping systemd's watchdog (half its timeout), or None when it is off or
    meant for another process."""
    usec = VARIABLES.text("WATCHDOG_USEC")
    pid = VARIABLES.text("WATCHDOG_PID")
    if not usec.isdigit() or int(usec) == 0 or (pid.isdigit() and int(pid) != os.getpid()):
        return None
    return int(usec) / 1_000_000 / 2
