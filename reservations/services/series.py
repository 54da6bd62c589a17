"""Recurring reservations: a series books one ordinary reservation per window of its rule,
up to a horizon ahead, and the reconciler extends it as time passes.

An occurrence that does not fit stays `pending` with its reason, like any reservation. One
that the quota or the offering's limits refuse is kept on the series (`refusals`) with an
event saying why, never dropped silently. Occurrences already begun when the series is made
are skipped.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Q

from audit.services import audit_record, audited
from compute.core.db import database_now
from compute.core.errors import InvalidArgument, InvalidState, LimitExceeded, QuotaExceeded
from compute.platform.events.services import event_emit
from compute.platform.tenancy.models import Principal, Tenant
from fleet.selectors import access_pool_by_id
from reservations.candidates import MAX_START_AHEAD, instant
from reservations.device_filter import parse_selector
from reservations.events import ReservationEvent
from reservations.models import Reservation, ReservationSeries, ReservationState
from reservations.recurrence import parse_rule, zone_named
from reservations.selectors import access_series_by_id
from reservations.services.book import book_new, check_could_fit, check_pool_request
from reservations.services.release import end_reservation
from reservations.shape import Shape

MAX_HORIZON_DAYS = 366
OPEN = (ReservationState.PENDING, ReservationState.PLACED)  # not begun: cancelled with it


def book_ahead(series: ReservationSeries, now: datetime) -> tuple[int, int]:
    """Create the series' occurrences on the days up to its horizon not booked yet; returns
    (created, refused). Inside the caller's service, which holds the series row's lock."""
    zone = zone_named(series.time_zone)
    today = now.astimezone(zone).date()
    first = max(series.first_day, series.booked_through + timedelta(days=1)
                if series.booked_through else series.first_day)
    last = min(series.until, today + timedelta(days=series.horizon_days))
    created = refused = 0
    rule = parse_rule(series.every)
    for start, end in rule.windows(zone, first, last):
        if start <= now:
            continue
        duration_ms = int((end - start) / timedelta(milliseconds=1))
        try:
            with transaction.atomic():
                book_new(tenant=series.tenant, pool=series.pool, now=now,
                         shape=Shape.of_series(series), requested_start=start,
                         duration_ms=duration_ms, series=series)
            created += 1
        except (QuotaExceeded, LimitExceeded) as error:
            refused += 1
            series.refusals = [*series.refusals, {"start": instant(start),
                                                  "reason": error.message}][-100:]
            event_emit(tenant_id=series.tenant_id, type=ReservationEvent.SERIES_OCCURRENCE_REFUSED,
                       subject=series.id, payload={"start": start, "reason": error.message})
        except IntegrityError:
            continue  # this occurrence exists already
    if last >= first:
        series.booked_through = last
    series.save(update_fields=["booked_through", "refusals"])
    return created, refused


@audited
def series_create(*, tenant: Tenant, actor: Principal, pool_id: str, gpus: int, every: str,
                  time_zone: str, until: date, topology: str = "any", first_day: date | None = None,
                  horizon_days: int = 14, product: str = "", selector: str = ""
                  ) -> ReservationSeries:
    """A series of reservations on the windows of `every` (in `time_zone`) from `first_day`
    (default today there) to `until`, booked `horizon_days` ahead."""
    rule_text = " ".join(every.lower().split())
    parse_rule(rule_text)
    zone = zone_named(time_zone)
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id)
    shape = Shape(count=gpus, topology=topology, product=product, selector=selector)
    check_pool_request(pool, shape)
    parse_selector(selector)
    check_could_fit(pool, shape)
    now = database_now()
    today = now.astimezone(zone).date()
    first_day = first_day or today
    if first_day < today:
        raise InvalidArgument(f"from: {first_day} is in the past", field="from")
    if until < first_day:
        raise InvalidArgument(f"until: {until} is before the first day {first_day}",
                              field="until")
    if until > today + MAX_START_AHEAD:
        raise InvalidArgument(f"until: at most {MAX_START_AHEAD.days} days ahead",
                              field="until")
    series = ReservationSeries.objects.create(
        tenant=tenant, pool=pool, count=gpus, topology=topology, product=product,
        selector=selector, every=rule_text, time_zone=time_zone, first_day=first_day,
        until=until, horizon_days=horizon_days)
    created, refused = book_ahead(series, now)
    data = {"poolId": pool.id, "gpus": gpus, "every": rule_text, "timezone": time_zone,
            "until": until.isoformat(), "occurrences": created, "refused": refused}
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="series.create",
                 target=series.id, data=data)
    event_emit(tenant_id=tenant.id, type=ReservationEvent.SERIES_CREATED, subject=series.id,
               payload=data)
    return series


@audited
def series_extend(*, series_id: str) -> int:
    """Book what came inside the horizon since the last pass (the reconciler's step);
    returns how many occurrences were created."""
    series = (ReservationSeries.objects.select_for_update(no_key=True, skip_locked=True)
              .select_related("tenant", "pool").filter(pk=series_id, ended_at__isnull=True)
              .first())
    if series is None:
        return 0
    created, refused = book_ahead(series, database_now())
    if created or refused:
        data = {"occurrences": created, "refused": refused,
                "bookedThrough": series.booked_through.isoformat()
                if series.booked_through else None}
        audit_record(tenant_id=series.tenant_id, actor_id="system", action="series.extend",
                     target=series.id, data=data, reason="the horizon moved")
        event_emit(tenant_id=series.tenant_id, type=ReservationEvent.SERIES_EXTENDED,
                   subject=series.id, payload=data)
    return created


@audited
def series_release(*, tenant: Tenant, actor: Principal, series_id: str) -> ReservationSeries:
    """End a series: its occurrences that have not begun are cancelled and no more are
    booked; one that holds GPUs now is left to run (release it on its own)."""
    series = access_series_by_id(tenant=tenant, series_id=series_id, lock=True)
    if series.ended_at is not None:
        raise InvalidState(f"series {series.id} has ended", state="ended")
    now = database_now()
    cancelled = []
    for rsv in (Reservation.objects.select_for_update(no_key=True).select_related("pool")
                .filter(series=series, state__in=OPEN).order_by("id")):
        if rsv.during is None or rsv.during.lower > now:
            end_reservation(rsv, to=ReservationState.CANCELLED, now=now)
            cancelled.append(rsv.id)
    series.ended_at = now
    series.save(update_fields=["ended_at"])
    data = {"cancelled": len(cancelled)}
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="series.release",
                 target=series.id, data=data)
    event_emit(tenant_id=tenant.id, type=ReservationEvent.SERIES_RELEASED, subject=series.id,
               payload=data)
    return series


def series_due(now: datetime) -> list[str]:
    """Live series whose horizon has moved past what they booked."""
    return [s.id for s in ReservationSeries.objects.filter(ended_at__isnull=True)
            .filter(Q(booked_through__isnull=True) | Q(booked_through__lt=F("until")))
            .only("id", "booked_through", "until", "horizon_days", "time_zone")
            if (s.booked_through or date.min) < min(
                s.until, now.astimezone(zone_named(s.time_zone)).date()
                + timedelta(days=s.horizon_days))]
