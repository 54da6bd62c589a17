"""CDI specs: reading the vendor's (NVIDIA Container Toolkit writes /etc/cdi/nvidia.yaml or
/var/run/cdi/nvidia.yaml), checking any spec against the CDI schema, and making a hold's.

A hold's spec names each held GPU `bcd.dev/gpu=<uuid>` and carries, for those GPUs only,
the vendor's per-device edits (its device node) plus the vendor's top-level edits (the
control device nodes, the driver libraries, the ldcache hook), without which CUDA cannot
start in the container. Without a vendor spec it falls back to the device nodes it can find
and NVIDIA_VISIBLE_DEVICES, and says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Every cdiVersion the CDI specification has released.
CDI_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0")
VENDOR_KIND = "nvidia.com/gpu"
# The directories runtimes read, lowest priority first (a later one overrides).
SPEC_DIRS = ("etc/cdi", "var/run/cdi")
KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
EDIT_FIELDS = {"env", "deviceNodes", "mounts", "hooks", "intelRdt", "additionalGids",
               "netDevices"}


class BadCdiSpec(ValueError):
    """A CDI spec that does not follow the schema; the reason names the first problem."""


def _strings(value: Any, where: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadCdiSpec(f"{where}: must be a list of strings")


def _objects(value: Any, where: str, required: tuple[str, ...],
             strings: tuple[str, ...] = ()) -> None:
    if not isinstance(value, list):
        raise BadCdiSpec(f"{where}: must be a list")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise BadCdiSpec(f"{where}[{i}]: must be an object")
        for name in required:
            if not isinstance(item.get(name), str) or not item[name]:
                raise BadCdiSpec(f"{where}[{i}].{name}: required")
        for name in strings:
            if name in item and not isinstance(item[name], str):
                raise BadCdiSpec(f"{where}[{i}].{name}: must be a string")


def check_edits(edits: Any, where: str) -> None:
    """containerEdits as the schema defines them (defs.json)."""
    if not isinstance(edits, dict):
        raise BadCdiSpec(f"{where}: must be an object")
    unknown = set(edits) - EDIT_FIELDS
    if unknown:
        raise BadCdiSpec(f"{where}: unknown field {sorted(unknown)[0]}")
    if "env" in edits:
        _strings(edits["env"], f"{where}.env")
    if "deviceNodes" in edits:
        _objects(edits["deviceNodes"], f"{where}.deviceNodes", ("path",),
                 ("hostPath", "permissions", "type"))
    if "mounts" in edits:
        _objects(edits["mounts"], f"{where}.mounts", ("hostPath", "containerPath"), ("type",))
        for i, mount in enumerate(edits["mounts"]):
            if "options" in mount:
                _strings(mount["options"], f"{where}.mounts[{i}].options")
    if "hooks" in edits:
        _objects(edits["hooks"], f"{where}.hooks", ("hookName", "path"))
        for i, hook in enumerate(edits["hooks"]):
            for name in ("args", "env"):
                if name in hook:
                    _strings(hook[name], f"{where}.hooks[{i}].{name}")
            timeout = hook.get("timeout", 0)
            if not isinstance(timeout, int) or not 0 <= timeout <= 2**32 - 1:
                raise BadCdiSpec(f"{where}.hooks[{i}].timeout: must be a uint32")


def check_spec(spec: Any) -> None:
    """Raise BadCdiSpec unless `spec` follows the CDI schema (schema.json and defs.json of
    the container-device-interface project)."""
    if not isinstance(spec, dict):
        raise BadCdiSpec("the spec must be an object")
    unknown = set(spec) - {"cdiVersion", "kind", "devices", "containerEdits", "annotations"}
    if unknown:
        raise BadCdiSpec(f"unknown field {sorted(unknown)[0]}")
    if spec.get("cdiVersion") not in CDI_VERSIONS:
        raise BadCdiSpec(f"cdiVersion: {spec.get('cdiVersion')!r} is not a CDI version")
    if not isinstance(spec.get("kind"), str) or not KIND.match(spec["kind"]):
        raise BadCdiSpec("kind: must be vendor/class, such as nvidia.com/gpu")
    devices = spec.get("devices")
    if not isinstance(devices, list):
        raise BadCdiSpec("devices: required, a list")
    names = set()
    for i, device in enumerate(devices):
        if not isinstance(device, dict) or set(device) - {"name", "containerEdits",
                                                          "annotations"}:
            raise BadCdiSpec(f"devices[{i}]: must be an object of name and containerEdits")
        name = device.get("name")
        if not isinstance(name, str) or not DEVICE_NAME.match(name):
            raise BadCdiSpec(f"devices[{i}].name: not a valid device name")
        if name in names:
            raise BadCdiSpec(f"devices[{i}].name: {name} appears twice")
        names.add(name)
        if "containerEdits" not in device:
            raise BadCdiSpec(f"devices[{i}].containerEdits: required")
        check_edits(device["containerEdits"], f"devices[{i}].containerEdits")
    if "containerEdits" in spec:
        check_edits(spec["containerEdits"], "containerEdits")
    for where, notes in [("annotations", spec.get("annotations", {})),
                         *((f"devices[{i}].annotations", d.get("annotations", {}))
                           for i, d in enumerate(devices))]:
        if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
            raise BadCdiSpec(f"{where}: must map names to strings")


@dataclass(frozen=True)
class VendorSpec:
    """NVIDIA's CDI spec for this machine: where it came from, its top-level edits, and each
    device's edits by name (a GPU UUID, an index, or `all`)."""

    source: str
    top_edits: dict[str, Any] = field(default_factory=dict)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)

    def edits_for(self, uuid: str, index: int | None) -> dict[str, Any] | None:
        """The edits of one GPU, by UUID or else by its index (the default name strategy)."""
        found = self.devices.get(uuid)
        if found is None and index is not None:
            found = self.devices.get(str(index))
        return found


def minimum_version(spec: dict[str, Any]) -> str:
    """The oldest cdiVersion that carries every feature `spec` uses (the rule of the CDI
    project's own library): a runtime that predates a newer version refuses a spec that
    claims it, so a spec claims no more than it needs (Podman 4.3 reads up to 0.5.0)."""
    devices = spec.get("devices", [])
    edits = [spec.get("containerEdits", {}), *(d.get("containerEdits", {}) for d in devices)]
    if any("netDevices" in e for e in edits):
        return "1.0.0"
    if any("intelRdt" in e or "additionalGids" in e for e in edits):
        return "0.7.0"
    kind_class = str(spec.get("kind", "")).partition("/")[2]
    if spec.get("annotations") or any(d.get("annotations") for d in devices) \
            or "." in kind_class:
        return "0.6.0"
    if any(not str(d.get("name", "a"))[:1].isalpha() for d in devices) or any(
            "hostPath" in node for e in edits for node in e.get("deviceNodes", [])):
        return "0.5.0"
    if any("type" in mount for e in edits for mount in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def read_spec_file(path: Path) -> dict[str, Any]:
    """One spec file, JSON or YAML by its suffix, checked against the schema."""
    try:
        text = path.read_text()
        spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise BadCdiSpec(f"{path}: cannot be read: {error}") from None
    try:
        check_spec(spec)
    except BadCdiSpec as error:
        raise BadCdiSpec(f"{path}: {error}") from None
    checked: dict[str, Any] = spec
    return checked


def vendor_spec(root: Path) -> VendorSpec | None:
    """The NVIDIA spec among the runtime's CDI directories under `root` (the later directory
    wins, as runtimes resolve it); None when there is none. A malformed NVIDIA spec raises
    BadCdiSpec: a hold must not be bound on a spec the runtime would refuse."""
    chosen: VendorSpec | None = None
    for directory in SPEC_DIRS:
        folder = root / directory
        if not folder.is_dir():
            continue
        for path in sorted([*folder.glob("*.json"), *folder.glob("*.yaml"),
                            *folder.glob("*.yml")]):
            if path.name.startswith("bcd-"):
                continue  # our own hold specs
            spec = read_spec_file(path)
            if spec["kind"] != VENDOR_KIND:
                continue
            chosen = VendorSpec(source=str(path), top_edits=spec.get("containerEdits", {}),
                                devices={d["name"]: d["containerEdits"]
                                         for d in spec["devices"]})
    return chosen


def merged(*edits: dict[str, Any]) -> dict[str, Any]:
    """Container edits combined in order (lists concatenated, without repeats)."""
    out: dict[str, list[Any]] = {}
    for edit in edits:
        for key, values in edit.items():
            if isinstance(values, list):
                bucket = out.setdefault(key, [])
                bucket.extend(v for v in values if v not in bucket)
    return dict(out)
