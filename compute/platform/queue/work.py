"""Enqueueing, shard leases and the worker pass."""

from __future__ import annotations

import functools
import logging
import math
import random
import zlib
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from compute.core.db import last_writes, prepared_cursor
from compute.core.metrics import WORK_DONE
from compute.core.sqltext import tables
from compute.platform.queue.models import SHARDS, ShardLease, WorkerPresence, WorkItem

logger = logging.getLogger("compute.platform.queue")
HANDLERS: dict[str, Callable[[str], None]] = {}


def handler(kind: str) -> Callable[[Callable[[str], None]], Callable[[str], None]]:
    """Register the reconciler of one kind of item (the key is its argument)."""

    def register(func: Callable[[str], None]) -> Callable[[str], None]:
        HANDLERS[kind] = func
        return func

    return register


def shard_of(kind: str, key: str) -> int:
    return zlib.crc32(f"{kind}:{key}".encode()) % SHARDS


WAKE_CHANNEL = "bc_work"


def enqueue(kind: str, key: str, *, due_at: datetime | None = None) -> None:
    """Make (kind, key) due (now, or at `due_at` if that is earlier than a due already set).
    In the caller's transaction, so an item is queued exactly when its change commits; the
    NOTIFY that goes with it wakes idle workers at that commit.

    Inside a write service, the item is written last (`hot_rows_last`): every service that
    frees a pool's capacity queues the same item, so its row is the hottest there is."""
    last = last_writes()
    if last is None:
        _upsert(kind, key, due_at)
        return
    earlier = last.get((enqueue, kind, key))
    if earlier is not None:  # queued already in this service: the earlier due stands
        before = earlier.keywords["due_at"]  # type: ignore[attr-defined]
        due_at = None if None in (before, due_at) else min(before, due_at)
    last[(enqueue, kind, key)] = functools.partial(_upsert, kind, key, due_at=due_at)


def _upsert(kind: str, key: str, due_at: datetime | None) -> None:
    with prepared_cursor() as cursor:
        cursor.execute(
            tables("WITH queued AS (INSERT INTO {WorkItem} (kind, key, shard, due_at, version, "
            "attempts, last_error) VALUES (%s, %s, %s, coalesce(%s, now()), 1, 0, '') "
            "ON CONFLICT (kind, key) DO UPDATE SET version = {WorkItem}.version + 1, "
            "due_at = LEAST({WorkItem}.due_at, EXCLUDED.due_at)) "
            "SELECT pg_notify(%s, '')",
                WorkItem=WorkItem),  # one round trip: the row and its wake-up
            [kind, key, shard_of(kind, key), due_at, WAKE_CHANNEL])


class Worker:
    """One worker: claims its fair share of shards, keeps the leases fresh, runs due items.

    The lease is renewed before each item, and an item runs only while the lease holds, so
    a worker that stalls past its lease stops before another takes the shard.
    """

    def __init__(self, owner: str, *, lease: timedelta = timedelta(seconds=10)) -> None:
        self.owner = owner
        self.lease = lease
        self.shards: set[int] = set()
        self._leases_exist = False

    @transaction.atomic
    def claim(self) -> set[int]:
        if not self._leases_exist:  # once per worker: the 256 lease rows, if missing
            ShardLease.objects.bulk_create([ShardLease(shard=s) for s in range(SHARDS)],
                                           ignore_conflicts=True)
            self._leases_exist = True
        with connection.cursor() as cursor:
            cursor.execute(tables("UPDATE {ShardLease} SET expires_at = now() + %s "
                           "WHERE owner = %s AND expires_at > now() RETURNING shard",
                               ShardLease=ShardLease),
                           [self.lease, self.owner])
            mine = {row[0] for row in cursor.fetchall()}
            cursor.execute(tables("INSERT INTO {WorkerPresence} (owner, expires_at) VALUES "
                           "(%s, now() + %s) ON CONFLICT (owner) DO UPDATE SET expires_at = "
                           "EXCLUDED.expires_at",
                               WorkerPresence=WorkerPresence), [self.owner, self.lease])
            cursor.execute(tables("SELECT count(*) FROM {WorkerPresence} WHERE "
                           "expires_at > now() AND owner <> %s",
                               WorkerPresence=WorkerPresence), [self.owner])
            others = cursor.fetchone()[0]
            share = math.ceil(SHARDS / (others + 1))
            if len(mine) > share:  # a new worker appeared: give shards back
                extra = sorted(mine)[share:]
                cursor.execute(tables("UPDATE {ShardLease} SET owner = '', expires_at = NULL "
                               "WHERE shard = ANY(%s) AND owner = %s",
                                   ShardLease=ShardLease), [extra, self.owner])
                mine -= set(extra)
            elif len(mine) < share:
                cursor.execute(
                    tables("UPDATE {ShardLease} SET owner = %s, expires_at = now() + %s "
                    "WHERE shard IN (SELECT shard FROM {ShardLease} WHERE owner = '' "
                    "OR expires_at IS NULL OR expires_at < now() ORDER BY random() LIMIT %s "
                    "FOR NO KEY UPDATE SKIP LOCKED) RETURNING shard", ShardLease=ShardLease),
                    [self.owner, self.lease, share - len(mine)])
                mine |= {row[0] for row in cursor.fetchall()}
        self.shards = mine
        return mine

    def _still_mine(self, shard: int) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(tables("UPDATE {ShardLease} SET expires_at = now() + %s WHERE "
                           "shard = %s AND owner = %s AND expires_at > now() RETURNING 1",
                               ShardLease=ShardLease),
                           [self.lease, shard, self.owner])
            return cursor.fetchone() is not None

    def run_once(self, *, limit: int = 100) -> int:
        """Claim shards, then run due items of those shards; returns how many ran."""
        self.claim()
        if not self.shards:
            return 0
        due = list(WorkItem.objects.filter(shard__in=self.shards, due_at__lte=timezone.now())
                   .order_by("due_at").values_list("id", "kind", "key", "shard",
                                                   "version")[:limit])
        done = 0
        for item_id, kind, key, shard, version in due:
            if not self._still_mine(shard):
                self.shards.discard(shard)
                continue
            try:
                HANDLERS[kind](key)
            except Exception as error:  # the item stays queued and backs off
                logger.exception("work item %s:%s failed", kind, key)
                WORK_DONE.labels(kind=kind, outcome="failed").inc()
                WorkItem.objects.filter(pk=item_id).update(
                    attempts=F("attempts") + 1, last_error=str(error)[:300],
                    due_at=timezone.now() + timedelta(seconds=2 ** random.randint(1, 6)))  # noqa: S311
                continue
            WorkItem.objects.filter(pk=item_id, version=version).delete()
            WORK_DONE.labels(kind=kind, outcome="done").inc()
            done += 1
        return done

    def seconds_to_next_due(self) -> float | None:
        """How long until the next item of this worker's shards is due (None: none is)."""
        if not self.shards:
            return None
        with connection.cursor() as cursor:
            cursor.execute(tables("SELECT extract(epoch FROM min(due_at) - now()) FROM "
                           "{WorkItem} WHERE shard = ANY(%s)",
                               WorkItem=WorkItem), [sorted(self.shards)])
            row = cursor.fetchone()
        return None if row is None or row[0] is None else max(0.0, float(row[0]))

    def release(self) -> None:
        ShardLease.objects.filter(owner=self.owner).update(owner="", expires_at=None)
        WorkerPresence.objects.filter(owner=self.owner).delete()


