"""The real machine: GPUs from nvidia-smi (query and NVLink topology), host from /proc."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUERY = "index,uuid,name,memory.total,temperature.gpu,utilization.gpu,power.draw"


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
    """GPUs joined by NV# links in `nvidia-smi topo -m`, grouped into domains."""
    rows = [line.split() for line in topology.splitlines() if line.startswith("GPU")]
    links: dict[int, set[int]] = {}
    for row in rows:
        here = int(row[0][3:])
        links.setdefault(here, {here})
        for other, cell in enumerate(row[1:len(rows) + 1]):
            if re.fullmatch(r"NV\d+", cell):
                links[here].add(other)
    domains: dict[int, str] = {}
    for gpu in sorted(links):
        if gpu in domains:
            continue
        members, pending = set(), [gpu]
        while pending:
            current = pending.pop()
            if current not in members:
                members.add(current)
                pending.extend(links.get(current, ()))
        name = f"nv{len(set(domains.values()))}" if len(members) > 1 else ""
        for member in members:
            domains[member] = name
    return domains


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "[N/A]" on boards that do not report it
        return 0.0


def parse_telemetry(csv: str) -> dict[str, dict[str, float]]:
    readings = {}
    for line in csv.strip().splitlines():
        uuid, utilization, temperature, power, memory = (p.strip() for p in line.split(","))
        readings[uuid] = {"utilization": _number(utilization), "temperatureC": _number(temperature),
                          "powerW": _number(power), "memoryUsedMiB": _number(memory)}
    return readings


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
        out = self._smi(f"--query-gpu={QUERY}", "--format=csv,noheader,nounits")
        domains = nvlink_domains(self._smi("topo", "-m"))
        gpus = []
        for line in out.strip().splitlines():
            index, uuid, name, memory, *_ = (part.strip() for part in line.split(","))
            gpus.append({"uuid": uuid, "index": int(index), "product": name,
                         "vramGiB": round(int(float(memory)) / 1024),
                         "nvlinkDomain": domains.get(int(index), ""), "health": "healthy"})
        return gpus

    def telemetry(self) -> dict[str, dict[str, float]]:
        """Measured readings per GPU UUID from nvidia-smi."""
        out = self._smi("--query-gpu=uuid,utilization.gpu,temperature.gpu,power.draw,"
                        "memory.used", "--format=csv,noheader,nounits")
        return parse_telemetry(out)

    def report(self) -> dict[str, Any]:
        return {**host_report(self.hostname), "gpus": self.gpus()}

    def start_watching(self) -> None:
        """nvidia-smi has no event stream: XIDs need NVML (the `nvml` extra)."""


def host_report(hostname: str) -> dict[str, Any]:
    """This machine's host part of the inventory: vCPUs, memory, serial, product UUID, MACs."""
    meminfo = Path("/proc/meminfo").read_text()
    total_kib = int(re.search(r"MemTotal:\s+(\d+)", meminfo).group(1))  # type: ignore[union-attr]
    return {"hostname": hostname, "vcpus": os.cpu_count() or 1,
            "memoryGiB": total_kib // (1024 * 1024), "serial": _dmi("product_serial"),
            "productUuid": _dmi("product_uuid"), "macs": _macs()}
