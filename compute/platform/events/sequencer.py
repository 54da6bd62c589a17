"""Positions for events, given after their transactions commit.

`seq` is taken when a row is written, not when its transaction commits, so a later `seq`
can commit first: a reader paging by `seq` could pass an event that commits after it read.
Readers page by `position` instead. A position is given only to a row already committed
(the numbering statement cannot see one in flight), by one numberer of the tenant at a time
(it holds the tenant's EventHead row), each pass after the last: positions are 1, 2, 3…
with no gap, never change once given, and a row committed after a reader's page gets a
position above every one that page held. So a reader that resumes after the last position
it saw sees every event of its tenant exactly once, in order. Within one pass rows are
numbered in the order they were written.

Readers number what has committed before they read; nothing else needs to run.
"""

from __future__ import annotations

from django.db import connection, transaction

from compute.core.sqltext import tables
from compute.platform.events.models import Event, EventHead

HEAD_SQL = tables("""
INSERT INTO {EventHead} (tenant_id, size) VALUES (%(tenant)s, 0)
    ON CONFLICT (tenant_id) DO NOTHING""", EventHead=EventHead)
LOCK_HEAD_SQL = tables("SELECT size FROM {EventHead} WHERE tenant_id = %(tenant)s "
                       "FOR NO KEY UPDATE",
    EventHead=EventHead)
# A statement after the head's lock: it sees every pass that committed before.
NUMBER_SQL = tables("""
WITH todo AS (
  SELECT seq, %(size)s + row_number() OVER (ORDER BY seq) AS position
    FROM {Event} WHERE tenant_id = %(tenant)s AND position IS NULL),
numbered AS (
  UPDATE {Event} SET position = todo.position FROM todo
   WHERE {Event}.seq = todo.seq RETURNING 1)
UPDATE {EventHead} SET size = size + (SELECT count(*) FROM numbered)
 WHERE tenant_id = %(tenant)s RETURNING size""", Event=Event, EventHead=EventHead)
WAITING_SQL = tables("""
SELECT EXISTS (SELECT 1 FROM {Event} WHERE tenant_id = %(tenant)s
                                             AND position IS NULL)""", Event=Event)


def event_sequence(*, tenant_id: str) -> int:
    """Give positions to the tenant's committed events that have none; how many."""
    params = {"tenant": tenant_id}
    with connection.cursor() as cursor:
        cursor.execute(WAITING_SQL, params)
        if not cursor.fetchone()[0]:
            return 0
        with transaction.atomic():
            cursor.execute(HEAD_SQL, params)
            cursor.execute(LOCK_HEAD_SQL, params)
            size = int(cursor.fetchone()[0])
            cursor.execute(NUMBER_SQL, {**params, "size": size})
            return int(cursor.fetchone()[0]) - size
