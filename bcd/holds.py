"""Device assignments (holds) on the node: a CDI spec, an env file and a slice per allocation
(their names come from bcd.contract.holds).

`bcd.dev/gpu=<uuid>` names exactly one held GPU. With NVIDIA's own CDI spec (from
`nvidia-ctk cdi generate`, in /etc/cdi or /var/run/cdi, JSON or YAML), each device carries
that GPU's edits and the spec carries the vendor's top-level edits (control devices, driver
libraries, hooks); otherwise the device nodes bcd finds plus NVIDIA_VISIBLE_DEVICES, and the
binding says which (`cdiSource`). Every spec bcd writes is checked against the CDI schema.
bcd never drops a hold on its own: only a newer spec removes one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

from bcd.cdi import BadCdiSpec, check_spec, merged, minimum_version, vendor_spec
from bcd.config import Paths, write_private
from bcd.contract.holds import CDI_KIND, Hold, holds_under

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                   "/dev/nvidia-modeset")
FALLBACK = "fallback: NVIDIA_VISIBLE_DEVICES and the device nodes found (no vendor CDI spec)"


def cdi_spec(hold: Hold, paths: Paths, gpu_index: dict[str, int]) -> tuple[dict[str, Any], str]:
    """The hold's CDI spec and where its device edits came from. Raises BadCdiSpec when the
    vendor's spec is malformed or lacks a held GPU: such a hold must not be bound."""
    vendor = vendor_spec(paths.root)
    ours = {"env": [f"{k}={v}" for k, v in hold.env.items()]}
    devices = []
    if vendor is not None:
        for uuid in hold.gpus:
            edits = vendor.edits_for(uuid, gpu_index.get(uuid))
            if edits is None:
                raise BadCdiSpec(f"{vendor.source} has no device {uuid}")
            devices.append({"name": uuid, "containerEdits": edits})
        top, source = merged(vendor.top_edits, ours), vendor.source
    else:
        for uuid in hold.gpus:
            found = _device_nodes(paths, f"/dev/nvidia{gpu_index.get(uuid, -1)}")
            devices.append({"name": uuid, "containerEdits": {"deviceNodes": found}
                            if found else {"env": [f"BCD_GPU={uuid}"]}})
        control = _device_nodes(paths, *CONTROL_DEVICES)
        env = [*ours["env"], f"NVIDIA_VISIBLE_DEVICES={','.join(hold.gpus)}"]
        top = {"env": env, **({"deviceNodes": control} if control else {})}
        source = FALLBACK
    spec = {"cdiVersion": "", "kind": CDI_KIND, "devices": devices, "containerEdits": top}
    spec["cdiVersion"] = minimum_version(spec)
    check_spec(spec)
    return spec, source


def _device_nodes(paths: Paths, *nodes: str) -> list[dict[str, str]]:
    """The device nodes among `nodes` that exist under the node's root, each with its host
    path when the root is not `/`. Only character devices: a simulated machine's GPU files
    are plain files (its workloads open them), which no container runtime could pass on."""
    found = [(node, paths.root / node.lstrip("/")) for node in nodes]
    return [{"path": node, **({} if str(paths.root) == "/" else {"hostPath": str(host)})}
            for node, host in found if host.is_char_device()]


def files_of(hold: Hold, paths: Paths) -> tuple[Path, Path]:
    return paths.cdi_dir / hold.cdi_spec_name, paths.root / hold.env_file.lstrip("/")


def notice_of(hold: Hold, paths: Paths) -> Path:
    return paths.root / hold.notice_file.lstrip("/")


def ending_of(hold: Hold, paths: Paths) -> Path:
    return paths.root / hold.ending_file.lstrip("/")


def write_ending_notice(hold: Hold, paths: Paths, now: datetime) -> float | None:
    """The ending file as the notice due now says it (removed when none is); returns it."""
    due, file = hold.notice_due(now), ending_of(hold, paths)
    if due is None:
        file.unlink(missing_ok=True)
        return None
    text = json.dumps({"reservationId": hold.reservation_id, "endsAt": hold.ends_at,
                       "noticeSeconds": due}) + "\n"
    if not file.exists() or file.read_text() != text:
        write_private(file, text)
    return due


def write_hold(hold: Hold, paths: Paths, gpu_index: dict[str, int]) -> dict[str, Any]:
    """Write (or rewrite: idempotent) the hold's files; returns what the node now holds.
    Raises BadCdiSpec before writing anything when no valid CDI spec can be made."""
    spec_file, env_file = files_of(hold, paths)
    spec, source = cdi_spec(hold, paths, gpu_index)
    slice_create(hold, paths)
    write_private(spec_file, json.dumps(spec, indent=2))
    spec_file.chmod(0o644)  # container runtimes read CDI specs
    write_private(env_file, "".join(f"{k}={v}\n" for k, v in {
        **hold.env,
        "BCD_RESERVATION_ID": hold.reservation_id,
        "BCD_CGROUP_PARENT": cgroup_parent(hold, paths),
        "BCD_CDI_DEVICES": ",".join(hold.cdi_devices),
        "NVIDIA_VISIBLE_DEVICES": ",".join(hold.gpus),
    }.items()))
    notice = notice_of(hold, paths)
    if hold.preempt_at:
        write_private(notice, json.dumps({"reservationId": hold.reservation_id,
                                          "preemptAt": hold.preempt_at}) + "\n")
    else:
        notice.unlink(missing_ok=True)
    return {**hold.binding(), "cgroupParent": cgroup_parent(hold, paths), "cdiSource": source}


def cgroup_parent(hold: Hold, paths: Paths) -> str:
    """Where the hold's workloads go: its systemd slice, or where systemd does not run, a
    cgroupfs path (a runtime with the cgroupfs manager refuses a slice name)."""
    return hold.slice_name if systemd_present(paths) else hold.cgroupfs_path


def holds_on_disk(paths: Paths) -> dict[str, Hold]:
    """The holds whose env files are on the node (bcd.contract.holds.holds_under)."""
    return holds_under(paths.root)


def remove_hold(hold: Hold, paths: Paths) -> bool:
    """Remove the spec and env file, and stop the slice if nothing runs in it: a release
    never kills a running workload. False when the slice is still busy (retry later)."""
    for path in (*files_of(hold, paths), notice_of(hold, paths), ending_of(hold, paths)):
        path.unlink(missing_ok=True)
    return slice_stop_if_empty(hold, paths) or not systemd_present(paths)


def systemd_present(paths: Paths) -> bool:
    return (paths.root / "run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=30,
                          check=False)


class SliceFailed(RuntimeError):
    """systemd could not create the hold's slice: the hold is not made, and says why."""


def slice_create(hold: Hold, paths: Paths) -> bool:
    """Create the hold's slice through systemd where it runs (a runtime unit, gone at
    reboot); a workload manager then places workloads in it. False without systemd; raises
    SliceFailed (after removing the unit) when systemctl refuses it."""
    if not systemd_present(paths):
        return False
    unit = paths.root / "run/systemd/system" / hold.slice_name
    unit.write_text(f"[Unit]\nDescription=better-compute hold {hold.allocation_id}\n\n"
                    "[Slice]\n")
    for step in (("daemon-reload",), ("start", hold.slice_name)):
        done = _systemctl(*step)
        if done.returncode != 0:
            unit.unlink(missing_ok=True)
            said = (done.stderr or done.stdout).strip().splitlines()
            raise SliceFailed(f"systemctl {' '.join(step)} failed (exit {done.returncode})"
                              + (f": {said[-1]}" if said else ""))
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
