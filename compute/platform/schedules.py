"""Every periodic job, by dotted path, and the one function that installs them in django-q2.

A job is a task function (`*_task`) that calls a reconciler or service; django-q2's cluster
(`manage.py qcluster`) runs them on the Postgres ORM broker.
"""

from __future__ import annotations

SCHEDULES: dict[str, dict[str, object]] = {
    "audit positions": {"func": "audit.tasks.sequence_all_task", "schedule_type": "I",
                        "minutes": 1},
    "audit checkpoints": {"func": "audit.tasks.checkpoint_all_task", "schedule_type": "H"},
    "gpu samples pruned": {"func": "fleet.tasks.samples_prune_task", "schedule_type": "H"},
}


def install_schedules() -> int:
    """Create or update every schedule (idempotent); returns how many exist."""
    from django_q.models import Schedule

    for name, fields in SCHEDULES.items():
        Schedule.objects.update_or_create(name=name, defaults=fields)
    return len(SCHEDULES)
