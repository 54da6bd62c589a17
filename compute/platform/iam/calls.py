"""How many calls one tenant, and one caller, may have running at once across every API
process: slots that are Postgres advisory locks, held by the call's own connection while it
runs (a process that dies gives its slots back with its connections). A call that finds no
free slot is answered 429 with Retry-After at once; the threads of each process are shared
fairly besides (compute.http.fair)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError, connection

from compute.core.errors import TooManyRequests

# A free slot among n, looked for from a random one: one statement, and at most one lock
# taken per key (the scan stops at the first row its filter passes).
_TAKE = ("SELECT (SELECT (s + %(at)s) %% %(tenants)s FROM generate_series(0, %(tenants)s - 1) s "
         "WHERE pg_try_advisory_lock(hashtext(%(tenant)s), (s + %(at)s) %% %(tenants)s) "
         "LIMIT 1), "
         "(SELECT (s + %(at)s) %% %(callers)s FROM generate_series(0, %(callers)s - 1) s "
         "WHERE pg_try_advisory_lock(hashtext(%(caller)s), (s + %(at)s) %% %(callers)s) "
         "LIMIT 1)")


@contextlib.contextmanager
def call_slot(*, principal_id: str, tenant_id: str) -> Iterator[None]:
    """Hold one of the tenant's and one of the caller's running-call slots for the block,
    or raise TooManyRequests."""
    tenants, callers = settings.BC_CALLS_PER_TENANT, settings.BC_CALLS_PER_CALLER
    keys = {"tenant": f"bc_calls_tenant:{tenant_id}", "caller": f"bc_calls_caller:{principal_id}"}
    with connection.cursor() as cursor:
        cursor.execute(_TAKE, {**keys, "tenants": tenants, "callers": callers,
                               "at": random.randrange(1 << 16)})  # noqa: S311 (spreading)
        tenant_slot, caller_slot = cursor.fetchone()
    taken = [(keys["tenant"], tenant_slot), (keys["caller"], caller_slot)]
    try:
        if tenant_slot is None or caller_slot is None:
            which = (f"{tenants} per tenant" if tenant_slot is None else
                     f"{callers} per caller")
            raise TooManyRequests(f"at most {which} calls run at once; try again shortly",
                                  retryAfterSeconds=1)
        yield
    finally:
        held = [(key, slot) for key, slot in taken if slot is not None]
        if held:  # one statement; a connection lost took its locks with it
            with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute("SELECT " + ", ".join(
                    ["pg_advisory_unlock(hashtext(%s), %s)"] * len(held)),
                    [value for pair in held for value in pair])
