"""Reads of the outbox."""

from __future__ import annotations

import fnmatch

from django.db.models import Max, Q

from compute.platform.events.models import Event
from compute.platform.events.sequencer import event_sequence
from compute.platform.events.types import known_types, parse_type_globs
from compute.platform.tenancy.models import Tenant


def type_filter(types: str | None) -> Q:
    """`node.*,reservation.placed` as a Q over Event.type; a glob that names no type is
    invalid_argument (a typo would otherwise watch nothing, silently)."""
    globs = parse_type_globs(types)
    if not globs:
        return Q()
    return Q(type__in=sorted({t for g in globs for t in fnmatch.filter(known_types(), g)}))


def latest_events(*, tenant: Tenant, count: int) -> list[Event]:
    """The tenant's `count` newest committed events, newest first."""
    event_sequence(tenant_id=tenant.id)
    return list(Event.objects.filter(tenant=tenant, position__isnull=False)
                .order_by("-position")[:count])


def event_head(*, tenant: Tenant) -> int:
    """The sequence of the tenant's newest event (0 when it has none): a watch from here on
    sees what happens from now."""
    event_sequence(tenant_id=tenant.id)
    newest = Event.objects.filter(tenant=tenant).aggregate(newest=Max("position"))["newest"]
    return int(newest or 0)


def event_list(*, tenant: Tenant, types: str | None = None, since: int = 0,
               subject: str | None = None, limit: int = 100) -> list[Event]:
    """The tenant's events after position `since`, oldest first (see
    compute.platform.events.sequencer: resuming after the last position seen skips nothing)."""
    event_sequence(tenant_id=tenant.id)
    queryset = Event.objects.filter(tenant=tenant, position__gt=since).filter(
        type_filter(types))
    if subject:
        queryset = queryset.filter(subject=subject)
    return list(queryset.order_by("position")[:limit])
