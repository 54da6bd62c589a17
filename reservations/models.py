"""The capacity ledger's tables."""

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

__all__ = ["Allocation", "Booking", "MaintenanceWindow", "Offering", "Quota", "Reservation",
           "ReservationSeries", "ReservationState", "Sandbox", "SandboxState", "Topology",
           "UsageRecord"]
