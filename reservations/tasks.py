"""django-q2 tasks of the ledger: interfaces only."""

from __future__ import annotations

from reservations.gaps import gaps_mend


def gaps_mend_task() -> int:
    """Rebuild the free time of nodes marked stale that no booker holds (every minute)."""
    return gaps_mend()
