"""The capacity ledger's tables."""

from reservations.models.gaps import GroupGap, StaleGaps
from reservations.models.ledger import (
    Allocation,
    Booking,
    Gang,
    MaintenanceWindow,
    Reservation,
    ReservationSeries,
    ReservationState,
    Topology,
)
from reservations.models.offerings import Offering, Quota
from reservations.models.sandboxes import Sandbox, SandboxState
from reservations.models.usage import UsageDelivery, UsageRecord

__all__ = ["Allocation", "Booking", "Gang", "GroupGap", "MaintenanceWindow", "Offering", "Quota",
           "Reservation", "ReservationSeries", "ReservationState", "Sandbox", "SandboxState",
           "StaleGaps", "Topology", "UsageDelivery", "UsageRecord"]
