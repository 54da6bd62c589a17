"""Transaction helpers: the one retry wrapper and the mapping of constraint violations."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

import psycopg
from django.db import IntegrityError, InterfaceError, OperationalError, connection
from django.db.backends.postgresql.base import ServerBindingCursor
from django.db.models import Model, Q
from django.db.models.expressions import RawSQL
from django.db.models.fields import AutoFieldMixin
from psycopg.conninfo import make_conninfo

from compute.core.dburl import PREPARING
from compute.core.errors import ComputeError
from compute.core.metrics import CONFLICTS, RETRIES

logger = logging.getLogger("compute.core.db")

P = ParamSpec("P")
R = TypeVar("R")

RETRYABLE_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock detected
MAX_ATTEMPTS = 5


def sqlstate(error: BaseException) -> str | None:
    cause = getattr(error, "__cause__", None)
    return getattr(cause, "sqlstate", None)


def connection_lost(error: BaseException) -> bool:
    """The database went away under this call: a broken or refused connection (SQLSTATE class
    08, or none at all) or a server shutting down or killing the session (57P01-57P03)."""
    if not isinstance(error, OperationalError | InterfaceError):
        return False
    state = sqlstate(error)
    return state is None or state.startswith("08") or state in {"57P01", "57P02", "57P03"}


def constraint_name(error: BaseException) -> str | None:
    cause = getattr(error, "__cause__", None)
    diag = getattr(cause, "diag", None)
    return getattr(diag, "constraint_name", None)


def retrying(func: Callable[P, R]) -> Callable[P, R]:
    """Retry the outermost transaction on serialization failures and deadlocks, with jitter.

    Sits above a durable `transaction.atomic`; constraint violations are domain answers
    and are never retried.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                return func(*args, **kwargs)
            except OperationalError as error:
                if sqlstate(error) not in RETRYABLE_SQLSTATES or attempt == MAX_ATTEMPTS:
                    raise
                RETRIES.inc()
                time.sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311 (jitter)
        raise AssertionError("unreachable")

    return wrapper


# Writes to rows every service touches (a pool's work item, say) wait for the end of the
# service: see `hot_rows_last`.
_LAST: ContextVar[dict[Hashable, Callable[[], None]] | None] = ContextVar("bc_last_writes",
                                                                         default=None)


def last_writes() -> dict[Hashable, Callable[[], None]] | None:
    """The writes the current service runs last, by key (a caller may merge into the one
    queued under its key); None outside a service: write now. A write queued inside a
    savepoint that is rolled back still runs, so it must be harmless then: a work item is
    (its handler reads the state it finds, and a missing row is nothing to do)."""
    return _LAST.get()


@contextmanager
def hot_rows_last() -> Iterator[None]:
    """Around a service's body, inside its transaction: the writes queued in `last_writes`
    run after the body, so a hot row's lock is the last the service takes. What it checks
    at commit waits for no other writer: foreign-key checks take KEY SHARE, which the row
    locks here (FOR NO KEY UPDATE) never block, and the nodes' claims referee locks a node
    the service locked already, before its bookings. A holder of a hot row then waits for
    nothing, and no deadlock passes through it."""
    token = _LAST.set({})
    try:
        yield
        for write in (_LAST.get() or {}).values():
            write()
    finally:
        _LAST.reset(token)


@contextmanager
def constraint_errors(mapping: dict[str, Callable[[], ComputeError]]) -> Iterator[None]:
    """Turn an IntegrityError on a named constraint into the domain error it stands for."""
    try:
        yield
    except IntegrityError as error:
        name = constraint_name(error) or ""
        factory = mapping.get(name)
        if factory is None:
            raise
        CONFLICTS.labels(constraint=name).inc()
        raise factory() from error


def conninfo(db: dict[str, Any] | None = None) -> str:
    """A libpq connection string for the default database, for a connection of one's own
    (a LISTEN that must outlive Django's per-request connections): the same hosts, TLS and
    session attributes as Django's."""
    from django.conf import settings

    db = db or settings.DATABASES["default"]
    parts = {"dbname": db["NAME"], "user": db["USER"], "password": db["PASSWORD"],
             "host": db["HOST"], "port": db["PORT"],
             **{k: v for k, v in db["OPTIONS"].items() if isinstance(v, str | int)}}
    return make_conninfo(**{k: v for k, v in parts.items() if v != ""})


PREPARE_AFTER = 2  # runs of one statement on a connection before it is prepared


def prepared_cursor() -> Any:
    """A cursor on the default connection whose parameters travel apart from the statement
    (server-side binding), so psycopg prepares a statement it has run a few times on this
    connection and Postgres plans it once, not at every call: planning cost the booking
    path's big statements more than running them. For the hot paths' fixed statements;
    the rest of Django binds on the client (Django leaves preparing off for poolers that
    cannot follow it; `BETTER_COMPUTE_DB_PREPARE=0` does the same here)."""
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None and PREPARING:
        raw.prepare_threshold = PREPARE_AFTER
    return connection._prepare_cursor(_PreparingCursor(raw))  # type: ignore[attr-defined]


_ServerBinding: Any = ServerBindingCursor  # untyped in Django's stubs


class _PreparingCursor(_ServerBinding):
    """Keeps its statement (with $n placeholders) where Django's query log reads it."""

    def _convert_query(self, query: Any, params: Any = None) -> Any:
        self._query = super()._convert_query(query, params)
        return self._query


M = TypeVar("M", bound=Model)


@functools.cache
def select_list(model: type[Model], alias: str) -> str:
    """`alias."column", …` for every concrete field of `model`, in field order."""
    return ", ".join(f'{alias}."{f.column}"' for f in model._meta.concrete_fields)


def from_row(model: type[M], values: Sequence[Any]) -> M:
    """A model instance from a raw row in `select_list` order, with the fields' own
    conversions from the database (JSON, for one), as a queryset would make it."""
    fields = model._meta.concrete_fields
    converted = [field.from_db_value(value, None, connection)  # type: ignore[attr-defined]
                 if value is not None and hasattr(field, "from_db_value") else value
                 for field, value in zip(fields, values, strict=True)]
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


def row_by_key(model: type[M], key: Any) -> M | None:
    """`model`'s row with primary key `key`, read by one prepared statement (the hot paths
    ask this on every call; a queryset compiles its SQL anew each time)."""
    table, pk = model._meta.db_table, model._meta.pk.column  # type: ignore[union-attr]
    with prepared_cursor() as cursor:
        cursor.execute(f'SELECT {select_list(model, "t")} FROM "{table}" t '  # noqa: S608
                       f'WHERE t."{pk}" = %s', [key])  # names from the model, never input
        row = cursor.fetchone()
    return None if row is None else from_row(model, row)


@functools.cache
def _insert_sql(model: type[Model], computed: tuple[tuple[str, str], ...]
                ) -> tuple[list[Any], str]:
    sql_for = dict(computed)
    fields = [f for f in model._meta.concrete_fields
              if not isinstance(f, AutoFieldMixin) and f.column not in sql_for]
    columns = ", ".join(f'"{c}"' for c in [*(f.column for f in fields), *sql_for])
    marks = ", ".join(["%s"] * len(fields) + list(sql_for.values()))
    table = model._meta.db_table  # names from the model, never input
    return fields, f'INSERT INTO "{table}" ({columns}) VALUES ({marks})'  # noqa: S608


def insert_row(instance: Model, **computed: str) -> None:
    """`instance.save(force_insert=True)` through one prepared statement: the same values
    (each field's own pre-save and database form), no SQL compiled per call. For a model
    whose primary key is the instance's own or generated by the database (not read back);
    `computed` gives columns as fixed SQL expressions (`txid=...`)."""
    fields, sql = _insert_sql(type(instance), tuple(sorted(computed.items())))
    values = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    with prepared_cursor() as cursor:
        cursor.execute(sql, values)
    instance._state.adding, instance._state.db = False, connection.alias


def known_related(instance: Model, name: str, objects: Sequence[Model]) -> None:
    """Tell `instance` that its related set `name` is exactly `objects` (a row its service
    has just written, say), as prefetch_related would, so reading it costs no query."""
    related = getattr(instance, name).all()
    related._result_cache, related._prefetch_done = list(objects), True
    cache = instance.__dict__.setdefault("_prefetched_objects_cache", {})
    cache[name] = related


def advisory_xact_lock(name: str) -> None:
    """Serialize with every other transaction that takes the same named lock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [name])


def database_now():
    with prepared_cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


# Commit-order fencing for rows read by a cursor (node specs by id). Keys are
# taken when a row is written, not when its transaction commits, so a later key can commit
# first. A row records the id of the transaction that wrote it (`txid`); a cursor reader sees
# only rows older than every transaction still in flight, so resuming after the last key it
# saw never skips a row that committed late.
TXID_SQL = "pg_current_xact_id()::text::bigint"
CURRENT_TXID = RawSQL(TXID_SQL, [])  # noqa: S611  (a fixed expression)
_SETTLED = RawSQL("pg_snapshot_xmin(pg_current_snapshot())::text::bigint", [])
_MINE = RawSQL("pg_current_xact_id_if_assigned()::text::bigint", [])


def settled() -> Q:
    """Rows whose writing transaction is older than every one in flight (or is this one)."""
    return Q(txid__lt=_SETTLED) | Q(txid=_MINE) | Q(txid__isnull=True)


async def listen_forever(channel: str, notified: Callable[[str | None], None]) -> None:
    """LISTEN on `channel` on a connection of one's own, for the life of the task: calls
    `notified(payload)` at every NOTIFY, and `notified(None)` after each (re)connection and
    each loss, since a notification sent while not listening is gone (the caller re-reads).
    Reconnects with backoff."""
    backoff = 0.5
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(conninfo(),
                                                             autocommit=True) as listening:
                await listening.execute(f"LISTEN {channel}")
                notified(None)  # anything committed while not listening is read now
                backoff = 0.5
                async for note in listening.notifies():
                    notified(note.payload)
        except (psycopg.Error, OSError) as error:
            logger.warning("listening on %s lost (%s); reconnecting", channel, error)
            notified(None)
        await asyncio.sleep(backoff)
        backoff = min(30.0, backoff * 2)
