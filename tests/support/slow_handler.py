"""A deliberately slow reconciler for the work-queue tests: it logs when it starts and ends
on which worker, so overlapping runs of one item would show."""

from __future__ import annotations

import os
import time

from django.db import connection

from compute.platform.queue.work import handler


@handler("test.slow")
def slow(key: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO test_slow_log (key, pid, started) VALUES "
                       "(%s, %s, clock_timestamp()) RETURNING id", [key, os.getpid()])
        row_id = cursor.fetchone()[0]
        time.sleep(0.2)
        cursor.execute("UPDATE test_slow_log SET ended = clock_timestamp() WHERE id = %s",
                       [row_id])
