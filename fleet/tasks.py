"""django-q2 tasks of the fleet: interfaces only, the work is in fleet.services."""

from __future__ import annotations

from fleet.services.sessions import claims_prune
from fleet.services.telemetry import samples_prune


def samples_prune_task() -> int:
    """Drop GPU samples older than a day, and report claims of past sessions (hourly)."""
    return samples_prune() + claims_prune()
