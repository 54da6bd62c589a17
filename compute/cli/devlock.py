"""One `dev` per state folder: a second one refuses at once, naming the one that runs, and
touches nothing of it (its machines' identities, token, ports and database stay)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import IO, Any

import click

LOCK_FILE = "dev.lock"


class StateLock:
    """An exclusive lock on the state folder, held while this process lives (the kernel
    drops it when the process ends, however it ends)."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.state_dir = state_dir
        self.handle: IO[str] = (state_dir / LOCK_FILE).open("a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            self.handle.close()
            raise click.ClickException(refusal(state_dir, holder)) from None
        self.record(pid=os.getpid())

    def _holder(self) -> dict[str, Any]:
        self.handle.seek(0)
        with contextlib.suppress(ValueError):
            found = json.loads(self.handle.read() or "{}")
            if isinstance(found, dict):
                return found
        return {}

    def record(self, **facts: Any) -> None:
        """Say who holds the folder (pid, and the API's URL once it serves)."""
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(json.dumps(facts))
        self.handle.flush()

    def release(self) -> None:
        self.handle.close()


def refusal(state_dir: Path, holder: dict[str, Any]) -> str:
    who = ", ".join(part for part in (f"pid {holder['pid']}" if holder.get("pid") else "",
                                      str(holder.get("url") or "")) if part)
    return (f"another `better-compute dev` runs on {state_dir}"
            f"{f' ({who})' if who else ''}; nothing of it was touched. Stop it first (Ctrl-C "
            "where it runs), or start a second one beside it with its own folder and port: "
            "better-compute dev --memory --state-dir OTHER_FOLDER --port OTHER_PORT")
