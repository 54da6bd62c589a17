"""Reads of the outbox."""

from __future__ import annotations

import fnmatch

from django.db.models import Q

from compute.db import settled
from compute.events.models import Event
from compute.events.types import EventType, parse_type_globs
from compute.tenancy.models import Tenant


def type_filter(types: str | None) -> Q:
    """`node.*,reservation.placed` as a Q over Event.type; a glob that names no type is
    invalid_argument (a typo would otherwise watch nothing, silently)."""
    globs = parse_type_globs(types)
    if not globs:
        return Q()
    return Q(type__in=sorted({t for g in globs for t in fnmatch.filter(EventType.values, g)}))


def latest_events(*, tenant: Tenant, count: int) -> list[Event]:
    """The tenant's `count` newest settled events, newest first."""
    return list(Event.objects.filter(tenant=tenant).filter(settled()).order_by("-seq")[:count])


def event_list(*, tenant: Tenant, types: str | None = None, since: int = 0,
               subject: str | None = None, limit: int = 100) -> list[Event]:
    queryset = (Event.objects.filter(tenant=tenant, seq__gt=since).filter(type_filter(types))
                .filter(settled()))
    if subject:
        queryset = queryset.filter(subject=subject)
    return list(queryset.order_by("seq")[:limit])
