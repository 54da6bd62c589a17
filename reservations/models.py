"""The capacity ledger's tables."""

from reservations.ledger import (
    Allocation,
    Booking,
    MaintenanceWindow,
    Reservation,
    ReservationState,
    Topology,
)
from reservations.offerings import Offering, Quota
from reservations.sandboxes import Sandbox, SandboxState
from reservations.usage import UsageRecord

__all__ = ["Allocation", "Booking", "MaintenanceWindow", "Offering", "Quota", "Reservation",
           "ReservationState", "Sandbox", "SandboxState", "Topology", "UsageRecord"]
