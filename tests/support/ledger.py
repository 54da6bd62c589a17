"""Checks of the ledger that tests share, and running bookers at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from reservations.constraints import OVERLAPS_SQL, PART_OVERLAPS_SQL

__all__ = ["OVERLAPS_SQL", "PART_OVERLAPS_SQL", "overlapping_bookings", "run_together"]


def overlapping_bookings() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(OVERLAPS_SQL)
        return int(cursor.fetchone()[0])


def run_together(*calls: Callable[[], Any]) -> None:
    """Each call on a thread of its own, all started, then all joined."""
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
