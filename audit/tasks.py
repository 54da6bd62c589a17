"""django-q2 tasks of the audit trail: interfaces only, the work is in audit.checkpoints."""

from __future__ import annotations

from audit.checkpoints import checkpoint_seal_all
from audit.sequencer import audit_sequence_all


def checkpoint_all_task() -> int:
    """Sign checkpoints over every tenant's new audit events (hourly)."""
    return len(checkpoint_seal_all())


def sequence_all_task() -> int:
    """Give positions to every tenant's settled audit rows (each minute)."""
    return audit_sequence_all()
