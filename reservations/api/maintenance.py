"""API methods maintenance.*: windows during which a node takes no bookings."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import STRING, TIME, nullable, obj, page_of
from compute.platform.paging import page
from fleet.api.nodes import NODE
from reservations import selectors
from reservations.api.reservations import MAX_DURATION_MS
from reservations.events import ReservationEvent
from reservations.models import MaintenanceWindow
from reservations.services import maintenance as service

WINDOW = obj(id=STRING, nodeId=STRING, start=TIME, end=TIME, reason=STRING, createdBy=STRING,
             createdAt=TIME, cancelledAt=nullable(TIME))
WINDOW_SUBJECT = Subject("maintenance", selectors.access_maintenance_by_id, "window_id")


def present_window(held: MaintenanceWindow) -> dict[str, Any]:
    return {"id": held.id, "nodeId": held.node_id, "start": held.during.lower,
            "end": held.during.upper, "reason": held.reason, "createdBy": held.created_by,
            "createdAt": held.created_at, "cancelledAt": held.cancelled_at}


class MaintenanceCreateIn(Input):
    node_id = PublicIdField("node")
    duration = serializers.IntegerField(min_value=60_000, max_value=MAX_DURATION_MS,
                                        help_text="Milliseconds (at least a minute).")
    start = serializers.DateTimeField(required=False, help_text="Absent: now.")
    start_in = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DURATION_MS,
                                        help_text="This many ms after now (server clock).")
    reason = serializers.CharField(max_length=300)
    move = serializers.BooleanField(required=False, default=False,
                                    help_text="Place the overlapping bookings that have not "
                                              "started on other nodes first (all or none).")


@endpoint("maintenance", "create",
          returns=obj(window=WINDOW, moved={"type": "object", "additionalProperties": STRING}),
          input=MaintenanceCreateIn, mutating=True, subject=NODE,
          emits=(ReservationEvent.NODE_MAINTENANCE_SCHEDULED, ReservationEvent.RESERVATION_REPLACED,
                 ReservationEvent.RESERVATION_PLACED))
def maintenance_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Take a node out of service for a window: refused naming the bookings it overlaps,
    unless `move` places those that have not started elsewhere."""
    held, moved = service.maintenance_create(
        tenant=ctx.tenant, actor=ctx.principal, node_id=ctx.subject.id,
        duration_ms=data["duration"], reason=data["reason"], start=data.get("start"),
        start_in_ms=data.get("start_in"), move=data["move"])
    return {"window": present_window(held), "moved": moved}


class MaintenanceListIn(ListInput):
    node_id = PublicIdField("node", required=False)


@endpoint("maintenance", "list", returns=page_of(WINDOW), input=MaintenanceListIn,
          mutating=False)
def maintenance_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Maintenance windows of your nodes (cancelled ones too)."""
    queryset = selectors.maintenance_list(tenant=ctx.tenant, node_id=data.pop("node_id", None))
    return page(queryset, present=present_window, **data)


class MaintenanceCancelIn(Input):
    window_id = PublicIdField("mnt")
    reason = serializers.CharField(required=False, default="", max_length=300,
                                   allow_blank=True)


@endpoint("maintenance", "cancel", returns=WINDOW, input=MaintenanceCancelIn, mutating=True,
          subject=WINDOW_SUBJECT, emits=(ReservationEvent.NODE_MAINTENANCE_CANCELLED,))
def maintenance_cancel(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """End a window now (or drop it before it starts)."""
    return present_window(service.maintenance_cancel(
        tenant=ctx.tenant, actor=ctx.principal, window_id=ctx.subject.id, reason=data["reason"]))
