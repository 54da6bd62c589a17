"""Reads of the outbox."""

from __future__ import annotations

import re

from django.db.models import Q
from django.db.models.expressions import RawSQL

from compute.events.models import Event
from compute.tenancy.models import Tenant


def type_filter(types: str | None) -> Q:
    """`node.*,reservation.placed` as a Q over Event.type (globs with `*` only)."""
    query = Q()
    for glob in filter(None, (t.strip() for t in (types or "").split(","))):
        pattern = "^" + ".*".join(re.escape(part) for part in glob.split("*")) + "$"
        query |= Q(type__regex=pattern)
    return query


# Sequences are taken when a row is written, not when its transaction commits: a later seq
# can commit first. Only events older than every transaction still in flight are shown, so
# a reader that resumes after the last seq it saw never skips one that committed late.
SETTLED = RawSQL("pg_snapshot_xmin(pg_current_snapshot())::text::bigint", [])
MINE = RawSQL("pg_current_xact_id_if_assigned()::text::bigint", [])


def event_list(*, tenant: Tenant, types: str | None = None, since: int = 0,
               subject: str | None = None, limit: int = 100) -> list[Event]:
    queryset = (Event.objects.filter(tenant=tenant, seq__gt=since).filter(type_filter(types))
                .filter(Q(txid__lt=SETTLED) | Q(txid=MINE) | Q(txid__isnull=True)))
    if subject:
        queryset = queryset.filter(subject=subject)
    return list(queryset.order_by("seq")[:limit])
