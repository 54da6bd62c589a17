"""GPUs that a fenced hold's workloads outlived (a process SIGKILL could not end, such as one
stuck in the driver): no other hold is given them, and the inventory reports them unhealthy
(so the control plane offers them to no one), until those processes are gone. Kept in a
file of the agent's state, so a restarted agent still knows."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bcd.config import write_private
from bcd.contract.holds import Hold
from bcd.fence import alive


@dataclass
class Unclean:
    path: Path
    left: dict[str, dict[str, Any]] = field(default_factory=dict)  # uuid -> pids, allocation
    # A spec's fencing marks and the inventory's pass prunes, each in a thread of its own.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def load(cls, path: Path) -> Unclean:
        try:
            left = json.loads(path.read_text())
        except (OSError, ValueError):
            left = {}
        return cls(path, left if isinstance(left, dict) else {})

    def mark(self, hold: Hold, survived: list[dict[str, Any]]) -> None:
        """The hold's GPUs stay unclean while any of the `survived` processes runs."""
        pids = sorted(int(w["pid"]) for w in survived)
        with self._lock:
            for uuid in hold.gpus:
                self.left[uuid] = {"pids": pids, "allocationId": hold.allocation_id}
            self._save()

    def prune(self) -> None:
        """Forget the processes that ended since, and the GPUs none of them holds any more."""
        with self._lock:
            kept = {uuid: {**entry, "pids": [pid for pid in entry["pids"] if alive(pid)]}
                    for uuid, entry in self.left.items()}
            kept = {uuid: entry for uuid, entry in kept.items() if entry["pids"]}
            if kept != self.left:
                self.left = kept
                self._save()

    def why(self, uuid: str) -> str:
        entry = self.left.get(uuid)
        if not entry:
            return ""
        pids = ", ".join(str(pid) for pid in entry["pids"])
        return f"pid {pids} of {entry['allocationId']} outlived its fence"

    def refusal(self, hold: Hold) -> str:
        """Why `hold` may not have its GPUs yet ("" when it may)."""
        for uuid in hold.gpus:
            if self.why(uuid):
                return f"{uuid}: {self.why(uuid)}"
        return ""

    def overlay(self, report: dict[str, Any]) -> dict[str, Any]:
        """The inventory with each unclean GPU (or GPU with an unclean MIG instance)
        reported unhealthy, and why."""
        if not self.left:
            return report
        gpus = []
        for gpu in report.get("gpus", []):
            uuids = [gpu.get("uuid", ""), *(m.get("uuid", "") for m in gpu.get("mig", []))]
            reason = next((self.why(uuid) for uuid in uuids if self.why(uuid)), "")
            gpus.append({**gpu, "health": "unhealthy", "healthReason": reason}
                        if reason else gpu)
        return {**report, "gpus": gpus}

    def _save(self) -> None:
        write_private(self.path, json.dumps(self.left, sort_keys=True))
