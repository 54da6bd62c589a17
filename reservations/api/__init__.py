"""The ledger's API groups, one module each (imported so that they register)."""

from reservations.api import (
    capacity,
    maintenance,
    offerings,
    reservations,
    sandboxes,
    series,
    sharing,
    usage,
)

__all__ = ["capacity", "maintenance", "offerings", "reservations", "sandboxes", "series",
           "sharing", "usage"]
