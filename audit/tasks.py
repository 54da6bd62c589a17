"""django-q2 tasks of the audit trail: interfaces only, the work is in audit.checkpoints."""

from __future__ import annotations

from audit.checkpoints import checkpoint_seal_all


def checkpoint_all_task() -> int:
    """Sign checkpoints over every tenant's new audit events (hourly)."""
    return len(checkpoint_seal_all())
