"""Where the agent learns what the machine has: NVML (or nvidia-smi) on real hardware, or a
simulated machine answering NVML's calls in tests and the dev stack (every host path under
a private root)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from bcd.config import VARIABLES


class InventorySource(Protocol):
    def report(self) -> dict[str, Any]:
        """The inventory in wire form (hostname, vcpus, memoryGiB, serial, gpus …)."""
        ...


    def telemetry(self) -> dict[str, dict[str, float]]:
        """Per GPU UUID: utilization, temperatureC, powerW, memoryUsedMiB."""
        ...

    def start_watching(self) -> None:
        """Start waiting for GPU events (XIDs) on a thread of its own."""
        ...

    def take_events(self) -> None:
        """Take the GPU events that came since the last look, without waiting (instead of
        `start_watching`, when one thread looks at many machines in turn)."""
        ...


SIM_VARIANTS = ("gpu", "gpu-2x4", "mig", "cpu")


def inventory_for(*, sim: bool, sim_gpus: int, sim_variant: str, hostname: str,
                  root: str = "") -> InventorySource:
    """The machine's inventory: simulated (`sim`; variants `gpu`: one NVSwitch domain,
    `gpu-2x4`: two NVLink-bridged halves, `mig`: half the GPUs in MIG mode, `cpu`), else
    NVML (nvidia-ml-py, when installed and a driver answers), else nvidia-smi."""
    if sim:
        from bcd.inventory.fake import MIG_LAYOUT, SimulatedInventory

        # BCD_SIM_VCPUS and BCD_SIM_MEMORY_GIB size a simulated machine's host (its VMs are
        # real, so a small host lets sandboxes and GPU host shares compete for it).
        cpu = sim_variant == "cpu"
        vcpus = int(VARIABLES.text("BCD_SIM_VCPUS") or (32 if cpu else 96))
        memory_gib = int(VARIABLES.text("BCD_SIM_MEMORY_GIB") or (128 if cpu else 1024))
        if cpu:
            return SimulatedInventory(hostname, gpus=0, root=root, vcpus=vcpus,
                                      memory_gib=memory_gib)
        domain = 4 if sim_variant == "gpu-2x4" else sim_gpus
        return SimulatedInventory(hostname, gpus=sim_gpus, nvlink_domain_size=domain, root=root,
                                  vcpus=vcpus, memory_gib=memory_gib,
                                  mig_layout=MIG_LAYOUT if sim_variant == "mig" else {})
    try:
        import pynvml  # the `nvml` extra: nvidia-ml-py
    except ImportError:
        pynvml = None
    from bcd.inventory.nvidia import NvidiaSmiInventory, host_report

    if pynvml is not None:
        from bcd.inventory.nvml import NvmlInventory, cleared_file_of

        try:
            return NvmlInventory(pynvml, host=lambda: host_report(hostname),
                                 cleared_file=cleared_file_of(Path(root or "/")))
        except pynvml.NVMLError:  # no driver loaded: fall back to nvidia-smi
            pass
    return NvidiaSmiInventory(hostname=hostname)
