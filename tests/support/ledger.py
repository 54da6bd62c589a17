"""Checks of the ledger that tests share, and running bookers at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# Pairs of bookings of one device that overlap in time: the EXCLUDE constraint keeps it 0.
OVERLAPS_SQL = ("SELECT count(*) FROM reservations_booking a JOIN reservations_booking b "
                "ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during")


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
