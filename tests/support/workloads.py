"""Real processes standing for a hold's workloads (no Django: the agent's tests use it too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def holding(device: Path, *, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    """A process that opens `device` (a GPU's device file) and keeps it open, ignoring
    SIGTERM if asked; returned once the file is open."""
    code = ("import signal, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + f"f = open({str(device)!r}, 'rb')\nprint('open', flush=True)\ntime.sleep(600)\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline() == b"open\n"
    return process
