"""The agent's journal: append-only JSON lines, fsynced before and after every step.

A step is journaled `begin` before it acts and `done` after, so after a crash the agent
knows what it started. Holds are idempotent and are simply converged again; a one-shot
command that was begun but not finished is never run again: its outcome is reported as
unknown. A lost journal starts a new epoch, which the control plane sees in Hello and
answers by never re-delivering commands of the older epoch.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # torn by a crash mid-write: drop it
                data = data[: data.rfind(b"\n") + 1]
                with path.open("r+b") as handle:
                    handle.truncate(len(data))
            for line in data.decode().splitlines():
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    break
        if not self.records or "epoch" not in self.records[0]:
            self.records = []
            self._write({"epoch": secrets.randbits(62) or 1})
        self.epoch = int(self.records[0]["epoch"])

    def _write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.records.append(record)

    def begin(self, kind: str, key: str, **data: Any) -> None:
        self._write({"kind": kind, "key": key, "phase": "begin", **data})

    def done(self, kind: str, key: str, **data: Any) -> None:
        self._write({"kind": kind, "key": key, "phase": "done", **data})

    def state(self, kind: str, key: str) -> dict[str, Any] | None:
        """The last record of (kind, key), or None if never journaled."""
        for record in reversed(self.records):
            if record.get("kind") == kind and record.get("key") == key:
                found: dict[str, Any] = record
                return found
        return None

    def held(self) -> dict[str, dict[str, Any]]:
        """Allocations whose hold is done and not released since."""
        holds: dict[str, dict[str, Any]] = {}
        for record in self.records:
            if record.get("phase") != "done":
                continue
            if record.get("kind") == "hold":
                holds[record["key"]] = record.get("hold", {})
            elif record.get("kind") == "unhold":
                holds.pop(record["key"], None)
        return holds

    def applied_generation(self) -> int:
        generations = [int(r.get("generation", 0)) for r in self.records
                       if r.get("kind") == "spec" and r.get("phase") == "done"]
        return max(generations, default=0)
