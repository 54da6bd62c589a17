"""Checks of the ledger that tests share, and running bookers at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# Pairs of bookings that overlap in time on one device, or on a GPU and one of its parts
# (MIG instances, shares), read from the devices themselves: the EXCLUDE constraints keep
# it 0.
PART_OVERLAPS_SQL = """
SELECT count(*) FROM reservations_booking a JOIN fleet_device da ON da.id = a.device_id
  JOIN reservations_booking b ON a.id <> b.id AND a.during && b.during
  JOIN fleet_device db ON db.id = b.device_id
 WHERE da.id = db.parent_id"""
OVERLAPS_SQL = f"""
SELECT (SELECT count(*) FROM reservations_booking a JOIN reservations_booking b
           ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during)
       + ({PART_OVERLAPS_SQL})"""


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
