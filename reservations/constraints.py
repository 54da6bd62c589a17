"""Every named ledger constraint and the domain error its violation stands for."""

from __future__ import annotations

from collections.abc import Callable

from compute.errors import CapacityConflict, ComputeError, QuotaExceeded

BOOKING_NO_OVERLAP = "reservations_booking_device_no_overlap"
GPU_NO_OVERLAP = "reservations_booking_gpu_no_overlap"
QUOTA_WITHIN_LIMIT = "reservations_quota_used_within_limit"
NODE_VCPUS_WITHIN_SIZE = "fleet_node_vcpus_within_size"
NODE_MEMORY_WITHIN_SIZE = "fleet_node_memory_within_size"

LEDGER_CONSTRAINTS: dict[str, Callable[[], ComputeError]] = {
    BOOKING_NO_OVERLAP: lambda: CapacityConflict("a device is already booked in that window"),
    GPU_NO_OVERLAP: lambda: CapacityConflict("the GPU or a part of it (a MIG instance, a "
                                             "share) is already booked in that window"),
    QUOTA_WITHIN_LIMIT: lambda: QuotaExceeded("the quota would be exceeded"),
    NODE_VCPUS_WITHIN_SIZE: lambda: CapacityConflict("the node has not enough vCPUs free"),
    NODE_MEMORY_WITHIN_SIZE: lambda: CapacityConflict("the node has not enough memory free"),
}
