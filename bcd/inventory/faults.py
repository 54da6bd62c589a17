"""Faults injected into a running simulated machine (`bcd --root R sim inject`): a file in
its state directory that its simulated GPUs read as their NVML readings. `util P` is not a
fault but a load: the GPU reports P % utilization until healed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from bcd.inventory.health import GpuReadings

FAULTS = ("xid", "ecc", "nvlink-down", "util", "heal")


def faults_file(root: Path) -> Path:
    return root / "var/lib/bcd/sim-faults.json"


def read_faults(path: Path) -> dict[int, GpuReadings]:
    """Each faulty GPU's readings, by index; a missing or torn file means none."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {int(index): _readings(fields) for index, fields in raw.items()}


def _readings(fields: dict[str, Any]) -> GpuReadings:
    return GpuReadings(
        ecc_volatile_uncorrected=int(fields.get("ecc_volatile_uncorrected", 0)),
        xids=tuple(int(e["xid"]) for e in fields.get("xid_events", ())),
        nvlink_links_down=int(fields.get("nvlink_links_down", 0)))


def utilization_set(path: Path) -> dict[int, int]:
    """GPUs whose utilization was set (`util P`), by index."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {int(index): int(fields["utilization"]) for index, fields in raw.items()
            if "utilization" in fields}


def xid_events(path: Path) -> list[dict[str, Any]]:
    """The injected XIDs as NVML events, each with an id of its own (an XID injected again
    after a heal is a new event)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [{"id": f"{index}/{event['at']}", "gpu": int(index), "xid": int(event["xid"])}
            for index, fields in raw.items() for event in fields.get("xid_events", ())]


def inject(path: Path, gpu: int, fault: str, code: int = 0) -> dict[str, Any]:
    """Add a fault to one GPU (or `heal` it) and return the GPU's readings now."""
    raw: dict[str, dict[str, Any]] = {}
    if path.exists():
        raw = json.loads(path.read_text())
    readings = raw.get(str(gpu), {})
    if fault == "heal":
        raw.pop(str(gpu), None)
        readings = {}
    elif fault == "xid":
        readings["xid_events"] = [*readings.get("xid_events", []),
                                  {"xid": code or 79, "at": time.time_ns()}]
    elif fault == "ecc":
        readings["ecc_volatile_uncorrected"] = readings.get("ecc_volatile_uncorrected", 0) + 1
    elif fault == "util":
        if not 0 <= code <= 100:
            raise ValueError(f"util {code}: a percentage, 0 to 100")
        readings["utilization"] = code
    elif fault == "nvlink-down":
        readings["nvlink_links_down"] = readings.get("nvlink_links_down", 0) + 1
    else:
        raise ValueError(f"unknown fault {fault}: one of {', '.join(FAULTS)}")
    if readings:
        raw[str(gpu)] = readings
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(raw))
    os.replace(partial, path)  # a reader sees the old file or the new one, never half
    return readings
