"""Inventory reports: what a machine says it has. Pure parsing and derivation, no ORM."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bcd.contract.profile import PROFILE_UNITS, UNIT_STATES
from compute.core.errors import InvalidArgument

_VENDOR_PREFIXES = ("NVIDIA ", "Tesla ")
_TWO_WORD_FAMILIES = ("RTX", "QUADRO", "GEFORCE")
VIRTUALIZATION = ("", "kvm", "tcg", "none", "probing")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def gpu_family(product: str) -> str:
    """The GPU model family of a product name: `H100-SXM5-80GB` and `NVIDIA H100 80GB HBM3`
    are both `H100`; `NVIDIA RTX 6000 Ada Generation` is `RTX-6000`."""
    name = product.strip()
    for prefix in _VENDOR_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
    tokens = [t for t in re.split(r"[\s\-_]+", name) if t]
    if not tokens:
        return ""
    if tokens[0].upper() in _TWO_WORD_FAMILIES and len(tokens) > 1:
        return f"{tokens[0].upper()}-{tokens[1].upper()}"
    return tokens[0].upper()


@dataclass(frozen=True)
class MigReport:
    uuid: str
    profile: str
    vram_gib: int


@dataclass(frozen=True)
class GpuReport:
    uuid: str
    index: int
    product: str
    vram_gib: int
    nvlink_domain: str = ""
    healthy: bool = True
    health_reason: str = ""
    mig: tuple[MigReport, ...] = ()

    @property
    def model(self) -> str:
        return gpu_family(self.product)


@dataclass(frozen=True)
class InventoryReport:
    hostname: str
    vcpus: int
    memory_gib: int
    serial: str = ""
    product_uuid: str = ""
    macs: tuple[str, ...] = ()
    gpus: tuple[GpuReport, ...] = field(default_factory=tuple)
    simulated_root: str = ""  # a simulated machine: its agent's private root
    virtualization: str = ""  # kvm | tcg | none | probing; "" from agents that do not say
    profile: dict[str, Any] = field(default_factory=dict)  # units' states, as reported
    topology: dict[str, str] | None = None  # rack and rail; None: not said

    def models(self) -> set[str]:
        return {gpu.model for gpu in self.gpus}


def _get(data: dict[str, Any], key: str, kind: type, where: str, default: Any = None) -> Any:
    value = data.get(key, default)
    if value is None and default is None:
        raise InvalidArgument(f"{where}{key} is required", field=f"{where}{key}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidArgument(f"{where}{key} must be a non-negative integer",
                              field=f"{where}{key}")
    if kind is str and not isinstance(value, str):
        raise InvalidArgument(f"{where}{key} must be a string", field=f"{where}{key}")
    return value


def parse_inventory(data: dict[str, Any]) -> InventoryReport:
    """Validate a report in wire form (camelCase), naming the first bad field."""
    if not isinstance(data, dict):
        raise InvalidArgument("inventory must be an object")
    gpus = []
    for i, raw in enumerate(data.get("gpus") or []):
        where = f"gpus[{i}]."
        if not isinstance(raw, dict):
            raise InvalidArgument(f"{where[:-1]} must be an object", field=where[:-1])
        migs = tuple(
            MigReport(uuid=_get(m, "uuid", str, f"{where}mig[{j}]."),
                      profile=_get(m, "profile", str, f"{where}mig[{j}]."),
                      vram_gib=_get(m, "vramGiB", int, f"{where}mig[{j}].", 0))
            for j, m in enumerate(raw.get("mig") or []))
        gpus.append(GpuReport(
            uuid=_get(raw, "uuid", str, where), index=_get(raw, "index", int, where, i),
            product=_get(raw, "product", str, where), vram_gib=_get(raw, "vramGiB", int, where, 0),
            nvlink_domain=str(raw.get("nvlinkDomain") or ""),
            healthy=raw.get("health", "healthy") == "healthy",
            health_reason=str(raw.get("healthReason") or "")[:200], mig=migs))
    uuids = [g.uuid for g in gpus] + [m.uuid for g in gpus for m in g.mig]
    if len(set(uuids)) != len(uuids):
        raise InvalidArgument("gpus: a device UUID appears twice", field="gpus")
    macs = tuple(str(m).lower() for m in data.get("macs") or [])
    bad = [m for m in macs if not _MAC.match(m)]
    if bad:
        raise InvalidArgument(f"macs: {bad[0]!r} is not a MAC address", field="macs")
    simulated = data.get("simulated") or {}
    if not isinstance(simulated, dict):
        raise InvalidArgument("simulated must be an object", field="simulated")
    root = _get(simulated, "root", str, "simulated.", "/") if simulated else ""
    if simulated and (not root.startswith("/") or len(root) > 300):
        raise InvalidArgument("simulated.root must be an absolute path",
                              field="simulated.root")
    virtualization = _get(data, "virtualization", str, "", "")
    if virtualization not in VIRTUALIZATION:
        raise InvalidArgument(f"virtualization must be one of {', '.join(VIRTUALIZATION)}",
                              field="virtualization")
    return InventoryReport(
        simulated_root=root, virtualization=virtualization,
        topology=parse_topology(data.get("topology")),
        profile=parse_profile(data.get("profile") or {}),
        hostname=_get(data, "hostname", str, "", ""), vcpus=_get(data, "vcpus", int, ""),
        memory_gib=_get(data, "memoryGiB", int, ""), serial=_get(data, "serial", str, "", ""),
        product_uuid=_get(data, "productUuid", str, "", ""), macs=macs, gpus=tuple(gpus))


_PLACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def parse_topology(data: Any) -> dict[str, str] | None:
    """Where the machine sits (`{rack, rail}`, each a short name), or None when the agent
    does not say (its node keeps the labels it has)."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise InvalidArgument("topology must be an object", field="topology")
    place = {}
    for key in ("rack", "rail"):
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not _PLACE.match(value):
            raise InvalidArgument(f"topology.{key} must be a name of letters, digits and "
                                  "._:- (at most 64)", field=f"topology.{key}")
        place[key] = value
    return place


def parse_profile(data: Any) -> dict[str, Any]:
    """The profile part of a report: `{generation, units: {name: {state, reason,
    generation, at}}}`, kept in that form once checked."""
    if not isinstance(data, dict):
        raise InvalidArgument("profile must be an object", field="profile")
    units = data.get("units") or {}
    if not isinstance(units, dict):
        raise InvalidArgument("profile.units must be an object", field="profile.units")
    checked: dict[str, Any] = {}
    for name, unit in units.items():
        where = f"profile.units.{str(name)[:40]}."
        if name not in PROFILE_UNITS:
            raise InvalidArgument(f"{where[:-1]} is not a unit", field=where[:-1])
        if not isinstance(unit, dict) or unit.get("state") not in UNIT_STATES:
            raise InvalidArgument(f"{where}state must be one of {', '.join(UNIT_STATES)}",
                                  field=f"{where}state")
        checked[name] = {"state": unit["state"],
                         "reason": str(_get(unit, "reason", str, where, ""))[:300],
                         "generation": _get(unit, "generation", int, where, 0),
                         "at": str(_get(unit, "at", str, where, ""))[:40]}
    return {"generation": _get(data, "generation", int, "profile.", 0), "units": checked}
