"""A simulated machine, labelled as such: an 8-GPU H100 SXM (HGX) server by default, all
eight GPUs on one NVSwitch domain; or two 4-GPU NVLink domains (PCIe cards with NVLink
bridges, the `gpu-2x4` variant); or CPU only."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcd.inventory.faults import faults_file, read_faults
from bcd.inventory.health import GpuReadings, gpu_health


@dataclass
class SimulatedInventory:
    name: str
    gpus: int = 8
    nvlink_domain_size: int = 8
    vcpus: int = 96
    memory_gib: int = 1024
    product: str = "H100-SXM5-80GB"
    root: str = ""  # the agent's private root, reported so paths can be shown where they are

    def readings(self) -> dict[int, GpuReadings]:
        """Each GPU's NVML-shaped readings: healthy, unless a fault was injected."""
        faults = read_faults(faults_file(Path(self.root))) if self.root else {}
        return {i: faults.get(i, GpuReadings()) for i in range(self.gpus)}

    def _id(self, what: str) -> str:
        return hashlib.sha256(f"{self.name}/{what}".encode()).hexdigest()

    def report(self) -> dict[str, Any]:
        serial = self._id("serial")
        health = {i: gpu_health(r) for i, r in self.readings().items()}
        return {
            "hostname": self.name, "vcpus": self.vcpus, "memoryGiB": self.memory_gib,
            "serial": f"SIM-{serial[:10]}", "productUuid": self._id("uuid")[:32],
            "macs": [":".join(["02", *[serial[i:i + 2] for i in range(0, 10, 2)]])],
            "simulated": {"root": self.root or "/"},
            "gpus": [{"uuid": f"GPU-{self._id(f'gpu{i}')[:8]}-{self._id(f'gpu{i}')[8:12]}-"
                              f"{self._id(f'gpu{i}')[12:16]}-{self._id(f'gpu{i}')[16:28]}",
                      "index": i, "product": self.product, "vramGiB": 80,
                      "nvlinkDomain": f"nv{i // self.nvlink_domain_size}"
                      if self.nvlink_domain_size > 1 else "",
                      "health": health[i][0], "healthReason": health[i][1]}
                     for i in range(self.gpus)],
        }

    def telemetry(self) -> dict[str, dict[str, float]]:
        """Simulated readings per GPU UUID: plausible, different per GPU, drifting per minute."""
        minute = int(time.time() // 60)
        readings: dict[str, dict[str, float]] = {}
        for gpu in self.report()["gpus"]:
            seed = int(hashlib.sha256(f"{gpu['uuid']}/{minute}".encode()).hexdigest()[:8], 16)
            readings[gpu["uuid"]] = {"utilization": seed % 101, "temperatureC": 30 + seed % 45,
                                     "powerW": 60 + seed % 600, "memoryUsedMiB": seed % 81920}
        return readings
