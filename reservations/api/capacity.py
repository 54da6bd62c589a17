"""API methods capacity.*."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.api.inputs import Input, PublicIdField
from compute.api.registry import CallContext, endpoint
from compute.api.shapes import BOOLEAN, INTEGER, STRING, TIME, array, nullable, obj, one_of
from reservations.api.pools import pool_subject
from reservations.api.reservations import MAX_DURATION_MS, RequestShapeIn, shape_kwargs
from reservations.capacity import capacity_preview as preview
from reservations.capacity import capacity_rollup
from reservations.device_filter import parse_selector
from reservations.ledger import Reservation


class CapacityGetIn(Input):
    pool_id = PublicIdField("pool")


HOST_ROW = obj(total=INTEGER, allocatable=INTEGER, allocated=INTEGER, available=INTEGER)
CAPACITY = obj(
    poolId=STRING, gpuModel=nullable(STRING), at=TIME, nodes=INTEGER,
    gpu=obj(total=INTEGER, allocatable=INTEGER, allocated=INTEGER, reserved=INTEGER,
            available=INTEGER),
    gpusNotSchedulable=obj(provisioning=INTEGER, unhealthy=INTEGER, maintenance=INTEGER,
                           unreachable=INTEGER),
    vcpu=HOST_ROW, memoryGiB=HOST_ROW, pending=INTEGER)
WINDOW = obj(start=TIME, end=TIME)
PREVIEW = one_of(
    obj(fits=BOOLEAN, poolId=STRING, gpus=INTEGER, window=WINDOW, reason=STRING),
    obj(fits=BOOLEAN, poolId=STRING, gpus=INTEGER, nodeId=STRING, nodeClass=STRING,
        devices=array(STRING), nvlinkDomains=array(STRING), vcpus=INTEGER, memoryGiB=INTEGER,
        window=WINDOW))


@endpoint("capacity", "get", returns=CAPACITY,
          input=CapacityGetIn, mutating=False, subject=pool_subject())
def capacity_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """A pool's capacity per resource: total, allocatable, allocated, reserved, available."""
    return capacity_rollup(ctx.subject)


class CapacityPreviewIn(RequestShapeIn):
    start = serializers.DateTimeField(required=False, help_text="Absent: now.")
    start_in = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DURATION_MS,
                                        help_text="This many ms after now (server clock).")


@endpoint("capacity", "preview", returns=PREVIEW, input=CapacityPreviewIn, mutating=False,
          subject=pool_subject())
def capacity_preview(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Would this request fit (now, or from a start), where, with which host share? If not,
    why. Books nothing."""
    start, start_in = data.pop("start", None), data.pop("start_in", None)
    kwargs = shape_kwargs(data)
    unsaved = Reservation(tenant=ctx.tenant, pool=ctx.subject, gpu_count=kwargs["gpus"],
                          topology=kwargs["topology"], duration_ms=kwargs["duration_ms"],
                          product=kwargs["product"], selector=kwargs["selector"])
    parse_selector(unsaved.selector)
    return preview(ctx.subject, unsaved, start=start, start_in_ms=start_in)
