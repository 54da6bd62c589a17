"""The capacity ledger's tables."""

from reservations.gaps import GroupGap, StaleGaps
from reservations.ledger import (
    Allocation,
    Booking,
    MaintenanceWindow,
    Reservation,
    ReservationSeries,
    ReservationState,
    Topology,
)
from reservations.offerings import Offering, Quota
from reservations.sandboxes import Sandbox, SandboxState
from reservations.usage import UsageRecord

__all__ = ["Allocation", "Booking", "GroupGap", "MaintenanceWindow", "Offering", "Quota",
           "Reservation", "ReservationSeries", "ReservationState", "Sandbox", "SandboxState",
           "StaleGaps", "Topology", "UsageRecord"]
