"""The real machine without NVML: GPUs from nvidia-smi (`-q -x`, `-L`, `topo -m`), host from
/proc and /sys."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcd.inventory.health import GpuReadings, gpu_health
from bcd.inventory.nvml import linked_domains


def _dmi(name: str) -> str:
    try:
        return Path(f"/sys/class/dmi/id/{name}").read_text().strip()
    except OSError:
        return ""


def _macs() -> list[str]:
    found = []
    for iface in sorted(Path("/sys/class/net").glob("*")):
        if iface.name == "lo":
            continue
        try:
            mac = (iface / "address").read_text().strip().lower()
        except OSError:
            continue
        if mac and mac != "00:00:00:00:00:00":
            found.append(mac)
    return found


def nvlink_domains(topology: str) -> dict[int, str]:
    """GPUs joined by NV# links in `nvidia-smi topo -m`, grouped into domains (the same
    grouping as NVML's links, bcd.inventory.nvml.linked_domains)."""
    rows = [line.split() for line in topology.splitlines() if line.startswith("GPU")]
    links = {row[0][3:]: [str(other) for other, cell in enumerate(row[1:len(rows) + 1])
                          if re.fullmatch(r"NV\d+", cell)] for row in rows}
    return {int(gpu): name for gpu, name in linked_domains(links, list(links)).items()}


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "[N/A]" on boards that do not report it
        return 0.0


def _value(node: ET.Element | None, path: str) -> str:
    found = node.find(path) if node is not None else None
    return (found.text or "").strip() if found is not None else ""


def _first(node: ET.Element, *paths: str) -> str:
    """The first of several spellings an element has had across driver versions."""
    return next((v for v in (_value(node, p) for p in paths) if v not in ("", "N/A")), "")


def _mib(text: str) -> int:
    return int(float(text.split()[0])) if text and text[0].isdigit() else 0


def mig_listing(listing: str) -> dict[str, list[dict[str, str]]]:
    """GPU UUID -> its MIG devices (profile, UUID), from `nvidia-smi -L`."""
    found: dict[str, list[dict[str, str]]] = {}
    current = ""
    for line in listing.splitlines():
        gpu = re.match(r"GPU \d+: .*\(UUID: (GPU-[^)]+)\)", line)
        mig = re.match(r"\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)", line)
        if gpu:
            current = gpu.group(1)
            found[current] = []
        elif mig and current:
            found[current].append({"profile": mig.group(1), "uuid": mig.group(2)})
    return found


def parse_smi_xml(xml: str, listing: str = "") -> list[dict[str, Any]]:
    """GPUs (no NVLink domain yet) from `nvidia-smi -q -x`, with health from the same
    readings NVML gives (XIDs excepted: nvidia-smi has no event stream) and MIG devices
    from `nvidia-smi -L`."""
    if not xml.strip():
        return []
    root = ET.fromstring(xml)  # noqa: S314  (the local nvidia-smi's own output)
    migs = mig_listing(listing)
    gpus = []
    for index, node in enumerate(root.findall("gpu")):
        uuid = _value(node, "uuid")
        thermal = _first(node, "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown",
                         "clocks_throttle_reasons/clocks_throttle_reason_hw_thermal_slowdown")
        slowdown = "thermal" if thermal == "Active" else ""
        ecc = _first(node, "ecc_errors/volatile/dram_uncorrectable",
                     "ecc_errors/volatile/double_bit/total")
        health, reason = gpu_health(GpuReadings(
            ecc_volatile_uncorrected=int(ecc) if ecc.isdigit() else 0,
            retired_pages_pending=_value(node, "retired_pages/pending_retirement") == "Yes",
            remapped_rows_pending=_value(node, "remapped_rows/remapped_row_pending") == "Yes",
            remapped_rows_failed=_value(node, "remapped_rows/remapped_row_failure") == "Yes",
            hw_slowdown=slowdown))
        sizes = [_mib(_value(m, "fb_memory_usage/total"))
                 for m in node.findall("mig_devices/mig_device")]
        mig = [{"uuid": d["uuid"], "profile": d["profile"],
                "vramGiB": round(sizes[i] / 1024) if i < len(sizes) else 0}
               for i, d in enumerate(migs.get(uuid, []))]
        gpus.append({"uuid": uuid, "index": index, "product": _value(node, "product_name"),
                     "vramGiB": round(_mib(_value(node, "fb_memory_usage/total")) / 1024),
                     "serial": _value(node, "serial"), "health": health,
                     "healthReason": reason, "mig": mig if _value(
                         node, "mig_mode/current_mig") == "Enabled" else []})
    return gpus


def smi_telemetry(xml: str) -> dict[str, dict[str, float]]:
    """Per GPU UUID: utilization, temperature, power and memory used, from -q -x."""
    if not xml.strip():
        return {}
    root = ET.fromstring(xml)  # noqa: S314
    return {_value(node, "uuid"): {
        "utilization": _number(_value(node, "utilization/gpu_util").split(" ")[0]),
        "temperatureC": _number(_value(node, "temperature/gpu_temp").split(" ")[0]),
        "powerW": _number(_first(node, "gpu_power_readings/power_draw",
                                 "power_readings/power_draw").split(" ")[0]),
        "memoryUsedMiB": float(_mib(_value(node, "fb_memory_usage/used")))}
        for node in root.findall("gpu")}


@dataclass
class NvidiaSmiInventory:
    hostname: str

    def _smi(self, *args: str) -> str:
        binary = shutil.which("nvidia-smi")
        if binary is None:
            return ""
        return subprocess.run([binary, *args], capture_output=True, text=True, timeout=30,
                              check=False).stdout

    def gpus(self) -> list[dict[str, Any]]:
        gpus = parse_smi_xml(self._smi("-q", "-x"), self._smi("-L"))
        domains = nvlink_domains(self._smi("topo", "-m"))
        for gpu in gpus:
            gpu["nvlinkDomain"] = domains.get(gpu["index"], "")
        return gpus

    def telemetry(self) -> dict[str, dict[str, float]]:
        """Measured readings per GPU UUID from nvidia-smi."""
        return smi_telemetry(self._smi("-q", "-x"))

    def report(self) -> dict[str, Any]:
        return {**host_report(self.hostname), "gpus": self.gpus()}

    def start_watching(self) -> None:
        """nvidia-smi has no event stream: XIDs need NVML (the `nvml` extra)."""

    def take_events(self) -> None:
        """As `start_watching`: nothing to take."""


def host_report(hostname: str) -> dict[str, Any]:
    """This machine's host part of the inventory: vCPUs, memory, serial, product UUID, MACs."""
    meminfo = Path("/proc/meminfo").read_text()
    total_kib = int(re.search(r"MemTotal:\s+(\d+)", meminfo).group(1))  # type: ignore[union-attr]
    return {"hostname": hostname, "vcpus": os.cpu_count() or 1,
            "memoryGiB": total_kib // (1024 * 1024), "serial": _dmi("product_serial"),
            "productUuid": _dmi("product_uuid"), "macs": _macs()}
