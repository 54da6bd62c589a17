"""Every named ledger constraint and the domain error its violation stands for."""

from __future__ import annotations

from collections.abc import Callable

from compute.core.errors import CapacityConflict, ComputeError, QuotaExceeded
from compute.core.sqltext import fill, tables
from fleet.models.devices import Device
from reservations.models import Booking

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

# Pairs of bookings that overlap in time on one device, or on a GPU and one of its parts
# (MIG instances, shares), read from the devices themselves: the constraints keep it 0.
PART_OVERLAPS_SQL = tables("""
SELECT count(*) FROM {Booking} a JOIN {Device} da ON da.id = a.device_id
  JOIN {Booking} b ON a.id <> b.id AND a.during && b.during
  JOIN {Device} db ON db.id = b.device_id
 WHERE da.id = db.parent_id""", Booking=Booking, Device=Device)
OVERLAPS_SQL = fill(tables("""
SELECT (SELECT count(*) FROM {Booking} a JOIN {Booking} b
           ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during)
       + ({parts})""", Booking=Booking), parts=PART_OVERLAPS_SQL)
