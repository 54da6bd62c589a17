"""Device assignments (holds) on the node: a CDI spec, an env file and a slice per allocation
(their names come from bcd.contract.holds).

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
from bcd.contract.holds import CDI_KIND, Hold

CDI_VERSION = "0.6.0"


def _vendor_edits(paths: Paths) -> dict[str, dict[str, Any]]:
    vendor = paths.cdi_dir / "nvidia.json"
    if not vendor.exists():
        return {}
    spec = json.loads(vendor.read_text())
    return {device["name"]: device.get("containerEdits", {})
            for device in spec.get("devices", [])}


def cdi_spec(hold: Hold, paths: Paths) -> dict[str, Any]:
    vendor = _vendor_edits(paths)
    devices = []
    for uuid in hold.gpus:
        edits = vendor.get(uuid)
        if edits is None:
            edits = {"env": [f"NVIDIA_VISIBLE_DEVICES={uuid}"]}
        devices.append({"name": uuid, "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices,
            "containerEdits": {"env": [f"BCD_ALLOCATION_ID={hold.allocation_id}"]}}


def files_of(hold: Hold, paths: Paths) -> tuple[Path, Path]:
    return paths.cdi_dir / hold.cdi_spec_name, paths.root / hold.env_file.lstrip("/")


def write_hold(hold: Hold, paths: Paths) -> dict[str, Any]:
    """Write (or rewrite: idempotent) the hold's files; returns what the node now holds."""
    spec_file, env_file = files_of(hold, paths)
    slice_create(hold, paths)
    write_private(spec_file, json.dumps(cdi_spec(hold, paths), indent=2))
    spec_file.chmod(0o644)  # container runtimes read CDI specs
    write_private(env_file, "".join(f"{k}={v}\n" for k, v in {
        "BCD_ALLOCATION_ID": hold.allocation_id,
        "BCD_RESERVATION_ID": hold.reservation_id,
        "BCD_CGROUP_PARENT": hold.slice_name,
        "BCD_CDI_DEVICES": ",".join(hold.cdi_devices),
        "NVIDIA_VISIBLE_DEVICES": ",".join(hold.gpus),
    }.items()))
    return hold.binding()


def remove_hold(hold: Hold, paths: Paths) -> bool:
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


def slice_create(hold: Hold, paths: Paths) -> bool:
    """Create the hold's slice through systemd where it runs (a runtime unit, gone at
    reboot); a workload manager then places workloads in it. False without systemd."""
    if not systemd_present(paths):
        return False
    unit = paths.root / "run/systemd/system" / hold.slice_name
    unit.write_text(f"[Unit]\nDescription=better-compute hold {hold.allocation_id}\n\n"
                    "[Slice]\n")
    _systemctl("daemon-reload")
    _systemctl("start", hold.slice_name)
    return True


def slice_stop_if_empty(hold: Hold, paths: Paths) -> bool:
    """Stop the slice only once nothing runs in it: a release never kills a workload.
    Returns whether it was stopped (a slice still in use is stopped on a later release)."""
    if not systemd_present(paths):
        return False
    shown = _systemctl("show", "-p", "TasksCurrent", "--value", hold.slice_name)
    if shown.stdout.strip() not in ("", "0", "[not set]"):
        return False
    _systemctl("stop", hold.slice_name)
    (paths.root / "run/systemd/system" / hold.slice_name).unlink(missing_ok=True)
    _systemctl("daemon-reload")
    return True
