"""The ledger's API groups, one module each (imported so that they register). Pools are
here, not in fleet, because offering a pool writes the ledger's quotas."""

from reservations.api import (
    capacity,
    maintenance,
    offerings,
    pools,
    reservations,
    sandboxes,
    series,
    usage,
)

__all__ = ["capacity", "maintenance", "offerings", "pools", "reservations", "sandboxes", "series",
           "usage"]
