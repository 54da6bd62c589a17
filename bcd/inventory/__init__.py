"""Where the agent learns what the machine has: nvidia-smi on real hardware, or a simulated
inventory in tests and the dev stack (every host path under a private root)."""

from __future__ import annotations

from typing import Any, Protocol


class InventorySource(Protocol):
    def report(self) -> dict[str, Any]:
        """The inventory in wire form (hostname, vcpus, memoryGiB, serial, gpus …)."""
        ...


    def telemetry(self) -> dict[str, dict[str, float]]:
        """Per GPU UUID: utilization, temperatureC, powerW, memoryUsedMiB."""
        ...


SIM_VARIANTS = ("gpu", "gpu-2x4", "cpu")


def inventory_for(*, sim: bool, sim_gpus: int, sim_variant: str, hostname: str,
                  root: str = "") -> InventorySource:
    """The machine's inventory: simulated (`sim`; variants `gpu`: one NVSwitch domain,
    `gpu-2x4`: two NVLink-bridged halves, `cpu`), else nvidia-smi."""
    if sim:
        from bcd.inventory.fake import SimulatedInventory

        if sim_variant == "cpu":
            return SimulatedInventory(hostname, gpus=0, vcpus=32, memory_gib=128, root=root)
        domain = 4 if sim_variant == "gpu-2x4" else sim_gpus
        return SimulatedInventory(hostname, gpus=sim_gpus, nvlink_domain_size=domain, root=root)
    from bcd.inventory.nvidia import NvidiaSmiInventory

    return NvidiaSmiInventory(hostname=hostname)
