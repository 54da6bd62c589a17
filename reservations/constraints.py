"""Every named ledger constraint and the domain error its violation stands for."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import connection

from compute.core.errors import CapacityConflict, ComputeError, QuotaExceeded
from compute.core.metrics import CONFLICTS
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

# The EXCLUDE constraints look for a clash through their GiST indexes; under heavy churn a
# GiST index has been seen to miss a live booking (Postgres 18.6), so a clash got past it.
# Whoever writes a node's bookings holds the node's row lock, so a statement run after the
# lock sees every other booking of the node's devices: the recheck reads them from the rows,
# through the btree `_like` index on `gpu_id` (its pattern operators, `~>=~` and `~<=~`,
# are equality here and no GiST index serves them) or by scanning, never through GiST.
# `mine` is a booking just written, `other` any booking: the constraints' rule between them.
CLASH = """other.gpu_id ~>=~ mine.gpu_id AND other.gpu_id ~<=~ mine.gpu_id
   AND range_overlaps(other.during, mine.during)
   AND (other.device_id = mine.device_id OR other.whole <> mine.whole)"""
CLASHES_SQL = fill(tables("""
SELECT count(*) FROM {Booking} mine JOIN {Booking} other ON {clash} AND other.id <> mine.id
 WHERE mine.allocation_id = %(allocation)s OR mine.maintenance_id = %(maintenance)s""",
                          Booking=Booking), clash=CLASH)
RECHECKED = "reservations_booking_recheck"


def refuse_clashes(clashes: int) -> None:
    """Raise what the constraints raise when the recheck found `clashes`."""
    if clashes and settings.BC_LEDGER_RECHECK:
        CONFLICTS.labels(constraint=RECHECKED).inc()
        raise LEDGER_CONSTRAINTS[GPU_NO_OVERLAP]()


def bookings_refereed(*, allocation_id: str | None = None,
                      maintenance_id: str | None = None) -> None:
    """Raise CapacityConflict when a booking of this allocation (or maintenance window)
    overlaps another of its device, or of its GPU and a part of it: the constraints' rule,
    checked again from the rows. Call it after the write, under the node's row lock."""
    if not settings.BC_LEDGER_RECHECK:
        return
    with connection.cursor() as cursor:
        cursor.execute(CLASHES_SQL, {"allocation": allocation_id, "maintenance": maintenance_id})
        refuse_clashes(cursor.fetchone()[0])
