"""API methods capacity.*."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, PublicIdField
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    STRING,
    TIME,
    array,
    nullable,
    obj,
    one_of,
)
from compute.core.db import database_now
from fleet.api.pools import pool_subject
from reservations.api.reservations import MAX_DURATION_MS, RequestShapeIn, shape_of
from reservations.capacity import capacity_earliest as earliest
from reservations.capacity import capacity_preview as preview
from reservations.capacity import capacity_rollup, gang_earliest, gang_preview
from reservations.device_filter import parse_selector
from reservations.services.book import check_atoms
from reservations.services.gang import check_gang_request
from reservations.shape import Ask
from reservations.timeline import MAX_STEPS, Span, pool_timeline


class CapacityGetIn(Input):
    pool_id = PublicIdField("pool")


HOST_ROW = obj(total=INTEGER, allocatable=INTEGER, allocated=INTEGER, available=INTEGER)
CAPACITY = obj(
    poolId=STRING, gpuModel=nullable(STRING), at=TIME, nodes=INTEGER,
    gpu=obj(total=INTEGER, allocatable=INTEGER, allocated=INTEGER, reserved=INTEGER,
            available=INTEGER),
    gpusNotSchedulable=obj(provisioning=INTEGER, unhealthy=INTEGER, maintenance=INTEGER,
                           unreachable=INTEGER),
    vcpu=HOST_ROW, memoryGiB=HOST_ROW, pending=INTEGER,
    parts=array(obj(**{"class": STRING}, profile=nullable(STRING), total=INTEGER,
                    available=INTEGER)))
WINDOW = obj(start=TIME, end=TIME)
PLACED = {"poolId": STRING, "gpus": INTEGER, "nodeId": STRING, "nodeClass": STRING,
          "devices": array(STRING), "nvlinkDomains": array(STRING), "vcpus": INTEGER,
          "memoryGiB": INTEGER, "window": WINDOW}
GANG = {"poolId": STRING, "gpus": INTEGER, "nodes": INTEGER, "racks": array(STRING),
        "rails": array(STRING), "placement": STRING,
        "members": array(obj(nodeId=STRING, devices=array(STRING))), "window": WINDOW}
PREVIEW = one_of(
    obj(fits=BOOLEAN, poolId=STRING, gpus=INTEGER, window=WINDOW, reason=STRING),
    obj(fits=BOOLEAN, **PLACED),
    obj(fits=BOOLEAN, poolId=STRING, gpus=INTEGER, nodes=INTEGER, window=WINDOW,
        reason=STRING),
    obj(fits=BOOLEAN, **GANG))
EARLIEST = one_of(
    obj(found=BOOLEAN, poolId=STRING, gpus=INTEGER, reason=STRING),
    obj(found=BOOLEAN, **PLACED),
    obj(found=BOOLEAN, poolId=STRING, gpus=INTEGER, nodes=INTEGER, reason=STRING),
    obj(found=BOOLEAN, **GANG))


@endpoint("capacity", "get", returns=CAPACITY,
          input=CapacityGetIn, mutating=False, subject=pool_subject())
def capacity_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """A pool's capacity per resource: total, allocatable, allocated, reserved, available."""
    return capacity_rollup(ctx.subject)


def gang_nodes() -> serializers.IntegerField:
    return serializers.IntegerField(
        required=False, default=1, min_value=1, max_value=64,
        help_text="Above 1, a gang: that many nodes, each with the devices asked; the answer "
                  "names them and how close together they are (racks, rails).")


class CapacityPreviewIn(RequestShapeIn):
    start = serializers.DateTimeField(required=False, help_text="Absent: now.")
    start_in = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DURATION_MS,
                                        help_text="This many ms after now (server clock).")
    nodes = gang_nodes()


@endpoint("capacity", "preview", returns=PREVIEW, input=CapacityPreviewIn, mutating=False,
          subject=pool_subject())
def capacity_preview(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Would this request fit (now, or from a start), where, with which host share? If not,
    why. Books nothing."""
    start, start_in = data.pop("start", None), data.pop("start_in", None)
    nodes = data.pop("nodes")
    if nodes > 1:
        ask = asked(ctx, data)
        check_gang_request(ask.shape, nodes, models=())
        return gang_preview(ask, nodes, start=start, start_in_ms=start_in)
    return preview(asked(ctx, data), start=start, start_in_ms=start_in)


class CapacityEarliestIn(RequestShapeIn):
    after = serializers.DateTimeField(required=False, help_text="Absent: now.")
    after_in = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DURATION_MS,
                                        help_text="This many ms after now (server clock).")
    before = serializers.DateTimeField(required=False,
                                       help_text="The window must end by then.")
    before_in = serializers.IntegerField(required=False, min_value=1_000,
                                         max_value=MAX_DURATION_MS,
                                         help_text="End by this many ms after now.")
    nodes = gang_nodes()


@endpoint("capacity", "earliest", returns=EARLIEST, input=CapacityEarliestIn, mutating=False,
          subject=pool_subject())
def capacity_earliest(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The earliest window in which this request fits on one node (after a time, ending
    before another), on which node and devices; or why none. Books nothing."""
    after, after_in = data.pop("after", None), data.pop("after_in", None)
    before, before_in = data.pop("before", None), data.pop("before_in", None)
    nodes = data.pop("nodes")
    if nodes > 1:
        ask = asked(ctx, data)
        check_gang_request(ask.shape, nodes, models=())
        return gang_earliest(ask, nodes, after=after, after_in_ms=after_in, before=before,
                             before_in_ms=before_in)
    return earliest(asked(ctx, data), after=after, after_in_ms=after_in, before=before,
                    before_in_ms=before_in)


def asked(ctx: CallContext, data: dict[str, Any]) -> Ask:
    """The question's shape on the pool, its atoms and selector checked."""
    shape = shape_of(data)
    check_atoms(ctx.subject, shape)
    parse_selector(shape.selector)
    return Ask(ctx.tenant.id, ctx.subject, shape, data.pop("duration"))


class CapacityTimelineIn(Input):
    pool_id = PublicIdField("pool")
    report_from = serializers.DateTimeField(required=False, help_text="Absent: an hour ago.")
    to = serializers.DateTimeField(required=False, help_text="Absent: a day after `from`.")
    resolution = serializers.IntegerField(
        required=False, min_value=60_000, max_value=MAX_DURATION_MS,
        help_text="The utilisation step in ms (absent: the window in 96 steps); at most "
                  f"{MAX_STEPS} steps.")
    aliases = {"from": "report_from"}


ROW = obj(id=STRING, uuid=STRING, **{"class": STRING}, index=INTEGER,
          profile=nullable(STRING), parentId=nullable(STRING), nodeId=STRING, node=STRING,
          nvlinkDomain=nullable(STRING), simulated=BOOLEAN, state=STRING, why=nullable(STRING))
BAR = one_of(
    obj(deviceId=STRING, start=TIME, end=TIME, kind=STRING),
    obj(deviceId=STRING, start=TIME, end=TIME, kind=STRING, maintenanceId=STRING,
        reason=STRING),
    obj(deviceId=STRING, start=TIME, end=TIME, kind=STRING, reservationId=STRING,
        tenantId=STRING, tenant=STRING, state=STRING, planned=BOOLEAN, priorityClass=STRING))
WAITING = obj(reservationId=STRING, tenantId=STRING, position=INTEGER, count=INTEGER,
              **{"class": STRING}, why=STRING, start=nullable(TIME), end=nullable(TIME),
              startFrom=STRING, deviceIds=array(STRING))
STEP = obj(start=TIME, end=TIME, gpuHours=NUMBER, allocatableGpuHours=NUMBER,
           allocatedGpuHours=NUMBER, measuredUtilisation=nullable(NUMBER), samples=INTEGER)
TIMELINE = obj(poolId=STRING, **{"from": TIME}, to=TIME, resolution=INTEGER, now=TIME,
               rows=array(ROW), truncated=BOOLEAN, bars=array(BAR), pending=array(WAITING),
               utilisation=array(STEP))


@endpoint("capacity", "timeline", returns=TIMELINE, input=CapacityTimelineIn, mutating=False,
          subject=pool_subject())
def capacity_timeline(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The pool's ledger over a window, as its calendar draws it: a row per device, each
    booking as a bar (another tenant's only as `busy`, unless the pool is yours), what
    waits at its planned or earliest start, and per step the GPU-hours there are, bookable
    and booked, with the utilisation the agents measured on booked GPUs."""
    now = database_now()
    start = data.get("report_from") or now - timedelta(hours=1)
    span = Span.of(start, data.get("to") or start + timedelta(days=1), data.get("resolution"))
    return pool_timeline(ctx.subject, viewer=ctx.tenant, span=span, now=now)
