"""Device assignments (holds) on the node: a CDI spec, an env file and a slice per allocation.

`bcd.dev/gpu=<uuid>` names exactly one held GPU. When NVIDIA's own CDI spec
(/etc/cdi/nvidia.json, from `nvidia-ctk cdi generate --device-name-strategy=uuid`) exists,
each device carries that GPU's device nodes, mounts and hooks copied from it; otherwise only
NVIDIA_VISIBLE_DEVICES. bcd never drops a hold on its own: only a newer spec removes one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bcd.config import Paths, write_private

CDI_KIND = "bcd.dev/gpu"
CDI_VERSION = "0.6.0"


def _vendor_edits(paths: Paths) -> dict[str, dict[str, Any]]:
    vendor = paths.cdi_dir / "nvidia.json"
    if not vendor.exists():
        return {}
    spec = json.loads(vendor.read_text())
    return {device["name"]: device.get("containerEdits", {})
            for device in spec.get("devices", [])}


def cdi_spec(hold: dict[str, Any], paths: Paths) -> dict[str, Any]:
    vendor = _vendor_edits(paths)
    devices = []
    for uuid in hold["gpus"]:
        edits = vendor.get(uuid)
        if edits is None:
            edits = {"env": [f"NVIDIA_VISIBLE_DEVICES={uuid}"]}
        devices.append({"name": uuid, "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices,
            "containerEdits": {"env": [f"BCD_ALLOCATION_ID={hold['allocationId']}"]}}


def files_of(hold: dict[str, Any], paths: Paths) -> tuple[Path, Path]:
    allocation = hold["allocationId"]
    return (paths.cdi_dir / f"bcd-{allocation}.json",
            paths.root / hold["envFile"].lstrip("/"))


def write_hold(hold: dict[str, Any], paths: Paths) -> dict[str, Any]:
    """Write (or rewrite: idempotent) the hold's files; returns what the node now holds."""
    spec_file, env_file = files_of(hold, paths)
    slice_create(hold, paths)
    write_private(spec_file, json.dumps(cdi_spec(hold, paths), indent=2))
    spec_file.chmod(0o644)  # container runtimes read CDI specs
    names = [f"{CDI_KIND}={uuid}" for uuid in hold["gpus"]]
    write_private(env_file, "".join(f"{k}={v}\n" for k, v in {
        "BCD_ALLOCATION_ID": hold["allocationId"],
        "BCD_RESERVATION_ID": hold.get("reservationId", ""),
        "BCD_CGROUP_PARENT": hold["cgroupParent"],
        "BCD_CDI_DEVICES": ",".join(names),
        "NVIDIA_VISIBLE_DEVICES": ",".join(hold["gpus"]),
    }.items()))
    return {"allocationId": hold["allocationId"], "cdiDevices": sorted(names),
            "envFile": hold["envFile"], "cgroupParent": hold["cgroupParent"]}


def remove_hold(hold: dict[str, Any], paths: Paths) -> bool:
    """Remove the spec and env file, and stop the slice if nothing runs in it: a release
    never kills a running workload. False when the slice is still busy (retry later)."""
    for path in files_of(hold, paths):
        path.unlink(missing_ok=True)
    return slice_stop_if_empty(hold, paths) or not systemd_present(paths)


def systemd_present(paths: Paths) -> bool:
    return (paths.root / "run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=30,
                          check=False)


def slice_create(hold: dict[str, Any], paths: Paths) -> bool:
    """Create the hold's slice through systemd where it runs (a runtime unit, gone at
    reboot); a workload manager then places workloads in it. False without systemd."""
    if not systemd_present(paths):
        return False
    unit = paths.root / "run/systemd/system" / hold["cgroupParent"]
    unit.write_text(f"[Unit]\nDescription=better-compute hold {hold['allocationId']}\n\n"
                    "[Slice]\n")
    _systemctl("daemon-reload")
    _systemctl("start", hold["cgroupParent"])
    return True


def slice_stop_if_empty(hold: dict[str, Any], paths: Paths) -> bool:
    """Stop the slice only once nothing runs in it: a release never kills a workload.
    Returns whether it was stopped (a slice still in use is stopped on a later release)."""
    if not systemd_present(paths):
        return False
    shown = _systemctl("show", "-p", "TasksCurrent", "--value", hold["cgroupParent"])
    if shown.stdout.strip() not in ("", "0", "[not set]"):
        return False
    _systemctl("stop", hold["cgroupParent"])
    (paths.root / "run/systemd/system" / hold["cgroupParent"]).unlink(missing_ok=True)
    _systemctl("daemon-reload")
    return True
