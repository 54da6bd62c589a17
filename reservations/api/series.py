"""API methods series.*: recurring reservations."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import page_of
from compute.core.errors import InvalidArgument
from compute.platform.paging import page
from fleet.api.pools import pool_subject
from reservations import presenters as wire
from reservations import selectors
from reservations.api.reservations import DevicesIn
from reservations.events import ReservationEvent
from reservations.presenters import present_series
from reservations.services import series as service

SERIES = Subject("series", selectors.access_series_by_id, "series_id")


class SeriesCreateIn(DevicesIn):
    every = serializers.CharField(max_length=64, help_text="e.g. 'weekdays 09:00-17:00'.")
    timezone = serializers.CharField(max_length=64, required=False, default="UTC",
                                     help_text="The rule's wall clock, e.g. Europe/Berlin.")
    first_day = serializers.DateField(required=False, help_text="Absent: today there.")
    until = serializers.DateField(help_text="The last day with an occurrence.")
    horizon_days = serializers.IntegerField(required=False, default=14, min_value=1,
                                            max_value=service.MAX_HORIZON_DAYS,
                                            help_text="How far ahead occurrences are booked.")
    aliases = {"from": "first_day"}


@endpoint("series", "create", returns=wire.SERIES, input=SeriesCreateIn, mutating=True,
          subject=pool_subject("series"),
          emits=(ReservationEvent.SERIES_CREATED, ReservationEvent.RESERVATION_PLACED,
                 ReservationEvent.RESERVATION_PENDING, ReservationEvent.SERIES_OCCURRENCE_REFUSED))
def series_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Reserve GPUs on every window of a rule until a day: one reservation per occurrence,
    booked a horizon ahead and extended as time passes."""
    device = data.pop("devices")[0]
    if device["device_class"] != "gpu":
        raise InvalidArgument("devices[0].class: a recurring reservation books whole GPUs",
                              field="devices")
    return present_series(service.series_create(
        tenant=ctx.tenant, actor=ctx.principal, pool_id=ctx.subject.id, gpus=device["count"],
        topology=device["topology"], every=data["every"], time_zone=data["timezone"],
        first_day=data.get("first_day"), until=data["until"],
        horizon_days=data["horizon_days"], product=data["product"],
        selector=data["selector"]))


class SeriesIdIn(Input):
    series_id = PublicIdField("ser")


@endpoint("series", "get", returns=wire.SERIES, input=SeriesIdIn, mutating=False,
          subject=SERIES)
def series_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One series, with its occurrences counted by state and what was refused."""
    return present_series(ctx.subject)


@endpoint("series", "list", returns=page_of(wire.SERIES), input=ListInput, mutating=False)
def series_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The tenant's series, oldest first."""
    return page(selectors.series_list(tenant=ctx.tenant), present=present_series, **data)


@endpoint("series", "release", returns=wire.SERIES, input=SeriesIdIn, mutating=True,
          subject=SERIES,
          emits=(ReservationEvent.SERIES_RELEASED, ReservationEvent.RESERVATION_CANCELLED))
def series_release(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """End a series: its occurrences that have not begun are cancelled."""
    return present_series(service.series_release(tenant=ctx.tenant, actor=ctx.principal,
                                                 series_id=ctx.subject.id))
