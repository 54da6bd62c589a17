"""The capacity ledger's tables."""

from reservations.offerings import Offering, Quota

__all__ = ["Offering", "Quota"]
