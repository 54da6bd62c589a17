"""A GPU's health from its readings, the same for NVML on a real host and for a simulated
GPU: volatile uncorrectable ECC errors, retired pages and remapped rows, XID events, NVLink
links down, and hardware throttling. The first problem found is the reason shown."""

from __future__ import annotations

from dataclasses import dataclass

HEALTHY, UNHEALTHY = "healthy", "unhealthy"

# XIDs that an application's own error raises (a bad kernel, a page fault in its memory):
# they say nothing of the GPU, as in the Kubernetes device plugin. Every other XID does.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
XID_MEANING = {
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "row remapping or page retirement event",
    64: "row remapping or page retirement failure", 74: "NVLink error",
    79: "the GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error",
}


@dataclass(frozen=True)
class GpuReadings:
    """What NVML says of one GPU (or what a simulated GPU says in its place)."""

    ecc_volatile_uncorrected: int = 0
    retired_pages_pending: bool = False
    remapped_rows_pending: bool = False
    remapped_rows_failed: bool = False
    xids: tuple[int, ...] = ()
    nvlink_links_down: int = 0
    hw_slowdown: str = ""  # "thermal" or "power" when the hardware throttles the clocks


def gpu_health(readings: GpuReadings) -> tuple[str, str]:
    """(health, reason): `healthy` with no reason, or `unhealthy` and why."""
    for xid in readings.xids:
        if xid not in APPLICATION_XIDS:
            return UNHEALTHY, f"XID {xid}: {XID_MEANING.get(xid, 'a driver-reported fault')}"
    if readings.remapped_rows_failed:
        return UNHEALTHY, "row remapping failed: memory cannot be repaired"
    if readings.ecc_volatile_uncorrected:
        return UNHEALTHY, (f"{readings.ecc_volatile_uncorrected} volatile uncorrectable ECC "
                           "error(s)")
    if readings.remapped_rows_pending or readings.retired_pages_pending:
        return UNHEALTHY, "memory repair pending: reset the GPU"
    if readings.nvlink_links_down:
        return UNHEALTHY, f"{readings.nvlink_links_down} NVLink link(s) down"
    if readings.hw_slowdown:
        return UNHEALTHY, f"hardware {readings.hw_slowdown} slowdown"
    return HEALTHY, ""
