"""A simulated machine, labelled as such: an 8-GPU H100 SXM (HGX) server by default, all
eight GPUs on one NVSwitch domain; or two 4-GPU NVLink domains (PCIe cards with NVLink
bridges, the `gpu-2x4` variant); or the HGX with GPUs 0-3 in MIG mode (the `mig` variant:
MIG_LAYOUT); or CPU only.

Its GPUs answer through NVML's interface (bcd.inventory.described), so inventory, health and
XID events go through the same code as on a real host; faults injected with
`bcd sim inject` change what they answer.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bcd.config import file_stamp
from bcd.inventory.described import DescribedNvml
from bcd.inventory.faults import faults_file, read_faults, utilization_set, xid_events
from bcd.inventory.nvml import NvmlInventory, cleared_file_of

SWITCHES = 4  # NVSwitch chips of an HGX H100 board
LINKS = 18  # NVLinks of an H100
FRESH_SECONDS = 0.1  # NVML calls this close together answer from one look at the faults file
# The `mig` variant's instances by GPU index: two GPUs as seven 1g.10gb, two as two 3g.40gb.
MIG_LAYOUT = {0: ["1g.10gb"] * 7, 1: ["1g.10gb"] * 7, 2: ["3g.40gb"] * 2, 3: ["3g.40gb"] * 2}


@dataclass
class SimulatedInventory:
    name: str
    gpus: int = 8
    nvlink_domain_size: int = 8
    vcpus: int = 96
    memory_gib: int = 1024
    product: str = "H100-SXM5-80GB"
    mig_layout: dict[int, list[str]] = field(default_factory=dict)  # GPUs in MIG mode
    root: str = ""  # the agent's private root, reported so paths can be shown where they are
    nvml: NvmlInventory = field(init=False, repr=False)
    _described: tuple[tuple[Any, ...], dict[str, Any]] | None = field(
        default=None, init=False, repr=False)
    _looked: float = field(default=float("-inf"), init=False, repr=False)
    _faults: Path | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        root = Path(self.root) if self.root else None
        self._faults = faults_file(root) if root else None
        self.nvml = NvmlInventory(DescribedNvml(self.describe), host=self.host,
                                  cleared_file=cleared_file_of(root) if root else None)
        if root is not None:  # its GPUs' device files, plain files a workload can hold open
            (root / "dev").mkdir(parents=True, exist_ok=True)
            for index in range(self.gpus):
                (root / "dev" / f"nvidia{index}").touch(exist_ok=True)

    def _id(self, what: str) -> str:
        return hashlib.sha256(f"{self.name}/{what}".encode()).hexdigest()

    def uuid(self, index: int) -> str:
        h = self._id(f"gpu{index}")
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:28]}"

    def _links(self, index: int) -> list[list[Any]]:
        """NVLinks as [state, remote bus id]: every link to a switch on an HGX board; to the
        other GPUs of the group with bridges; none for a lone card."""
        if self.nvlink_domain_size >= self.gpus and self.gpus > 1:
            return [[1, f"0000:{0xc0 + link % SWITCHES:02x}:00.0"] for link in range(LINKS)]
        if self.nvlink_domain_size > 1:
            first = index - index % self.nvlink_domain_size
            peers = [p for p in range(first, first + self.nvlink_domain_size) if p != index]
            return [[1, _bus(peer)] for peer in peers for _ in range(4)]
        return []

    def describe(self) -> dict[str, Any]:
        """The machine as NVML would answer now, injected faults included. NVML answers each
        call from the driver's state; the description is made again only when the faults
        file changed or the minute its readings drift by turned, and the calls of one
        inventory pass (hundreds, within milliseconds) share one `stat` of the file."""
        described = self._described
        now = time.monotonic()
        if described is not None and now - self._looked < FRESH_SECONDS:
            return described[1]
        self._looked = now
        minute = int(time.time() // 60)
        key = (file_stamp(self._faults) if self._faults else None, minute)
        if described is not None and described[0] == key:
            return described[1]
        description = self._describe_now(minute)
        self._described = (key, description)
        return description

    def _describe_now(self, minute: int) -> dict[str, Any]:
        faults = read_faults(self._faults) if self._faults else {}
        busy = utilization_set(self._faults) if self._faults else {}
        gpus = []
        for i in range(self.gpus):
            fault = faults.get(i)
            links = self._links(i)
            for link in links[:fault.nvlink_links_down if fault else 0]:
                link[0] = 0
            seed = int(hashlib.sha256(f"{self.uuid(i)}/{minute}"
                                      .encode()).hexdigest()[:8], 16)
            gpus.append({
                "uuid": self.uuid(i), "name": self.product, "busId": _bus(i),
                "numaNode": i * 2 // self.gpus,  # two sockets, half the GPUs on each
                "serial": f"SIM{self._id(f'sn{i}')[:10]}", "memoryTotal": 80 * 2**30,
                "memoryUsed": (seed % 81920) * 2**20, "nvlinks": links,
                "eccVolatileUncorrected": fault.ecc_volatile_uncorrected if fault else 0,
                "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": 0,
                                 "failure": 0},
                "utilization": busy.get(i, seed % 101), "temperatureC": 30 + seed % 45,
                "powerMw": (60 + seed % 600) * 1000, "mig": self._mig(i)})
        events = xid_events(self._faults) if self._faults else []
        return {"gpus": gpus, "events": events}

    def _mig(self, index: int) -> dict[str, Any]:
        """MIG mode and instances as NVML answers them (seven slots, empty ones None)."""
        profiles = self.mig_layout.get(index, [])
        devices: list[dict[str, Any] | None] = [None] * 7
        for slot, profile in enumerate(profiles):
            h = self._id(f"gpu{index}/mig{slot}")
            devices[slot] = {"uuid": f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:28]}",
                             "name": f"{self.product} MIG {profile}",
                             "memoryTotal": int(profile.split("g.")[1][:-2]) * 2**30}
        return {"mode": 1 if profiles else 0, "maxDevices": 7, "devices": devices}

    def host(self) -> dict[str, Any]:
        serial = self._id("serial")
        return {
            "hostname": self.name, "vcpus": self.vcpus, "memoryGiB": self.memory_gib,
            "serial": f"SIM-{serial[:10]}", "productUuid": self._id("uuid")[:32],
            "macs": [":".join(["02", *[serial[i:i + 2] for i in range(0, 10, 2)]])],
            "simulated": {"root": self.root or "/"},
        }

    def report(self) -> dict[str, Any]:
        return self.nvml.report()

    def telemetry(self) -> dict[str, dict[str, float]]:
        """Simulated readings per GPU UUID: plausible, different per GPU, drifting per minute."""
        return self.nvml.telemetry()

    def start_watching(self) -> None:
        self.nvml.start_watching()

    def take_events(self) -> None:
        self.nvml.take_events()


def _bus(index: int) -> str:
    return f"0000:{0x18 + index * 0x10:02x}:00.0"
