"""API methods reservations.*, and the request shape capacity.preview shares."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from bcd.contract.holds import SLURM_ACCOUNT
from compute.core.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import page_of
from compute.platform.paging import page
from fleet.api.pools import pool_subject
from fleet.models import DeviceClass
from fleet.presenters import CLASS_NAME
from reservations import presenters as wire
from reservations import selectors
from reservations.events import ReservationEvent
from reservations.models import ReservationState, Topology
from reservations.presenters import present_reservation
from reservations.services.book import reservation_create
from reservations.services.extend import reservation_extend
from reservations.services.release import reservation_release
from reservations.shape import Shape

MAX_DURATION_MS = 366 * 24 * 3_600_000
RESERVATION = Subject("reservation", selectors.access_reservation_by_id, "reservation_id")


class DeviceRequestIn(Input):
    device_class = serializers.ChoiceField(
        choices=DeviceClass.values,
        help_text="gpu: whole GPUs; mig: MIG instances of one profile; gpu-share: "
                  "time-sliced shares of a GPU (pools whose policy slices GPUs).")
    count = serializers.IntegerField(min_value=1, max_value=64)
    topology = serializers.ChoiceField(choices=Topology.choices, default=Topology.ANY)
    profile = serializers.RegexField(r"^[1-7]g\.[0-9]{1,4}gb(\+me)?$", required=False,
                                     default="", help_text="For mig: such as 1g.10gb.")
    aliases = {"class": "device_class"}


class DevicesIn(Input):
    """Which GPUs of which pool; shared by reservations, series and capacity questions."""

    pool_id = PublicIdField("pool")
    devices = DeviceRequestIn(many=True, min_length=1, max_length=1)
    product = serializers.CharField(required=False, default="", max_length=96, allow_blank=True)
    selector = serializers.CharField(required=False, default="", max_length=300,
                                     allow_blank=True, help_text="e.g. vramGiB >= 80")


class RequestShapeIn(DevicesIn):
    """What a reservation asks for; shared by reservations.create and capacity.*."""

    duration = serializers.IntegerField(min_value=1_000, max_value=MAX_DURATION_MS,
                                        help_text="Milliseconds (at least 1 s).")
    model = serializers.CharField(required=False, default="", max_length=32, allow_blank=True)
    kubernetes = serializers.BooleanField(required=False, default=False)
    slurm = serializers.RegexField(
        SLURM_ACCOUNT, required=False, default="", max_length=64, allow_blank=True,
        help_text="A Slurm account: the node's Slurm runs this account's jobs on the held GPUs.")


def shape_of(data: dict[str, Any]) -> Shape:
    """The request's shape, taken out of its validated input (what stays is the rest)."""
    device = data.pop("devices")[0]
    return Shape(count=device["count"], device_class=device["device_class"],
                 profile=device["profile"], topology=device["topology"],
                 fraction=device.get("fraction") or 0.0,
                 model=data.pop("model", ""), product=data.pop("product", ""),
                 selector=data.pop("selector", ""), kubernetes=data.pop("kubernetes", False),
                 slurm_account=data.pop("slurm", ""))


class ReservationDeviceIn(DeviceRequestIn):
    count = serializers.IntegerField(min_value=1, max_value=64, required=False, default=1,
                                     help_text="How many atoms (1 if left out).")
    fraction = serializers.FloatField(
        min_value=0.001, max_value=1, required=False,
        help_text="For gpu-share, instead of count: this part of one GPU (0.22), booked as the "
                  "fewest of the pool's time-sliced shares of one GPU that cover it.")
    models = serializers.ListField(
        child=serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,31}$", max_length=32),
        required=False, min_length=1, max_length=8,
        help_text="Acceptable GPU models: the pool named and the tenant's other GPU pools of "
                  "its site with one of these models are candidates; the placer picks among "
                  "them by the same scoring.")


class ReservationCreateIn(RequestShapeIn):
    devices = ReservationDeviceIn(many=True, min_length=1, max_length=1)
    start = serializers.DateTimeField(required=False, help_text="Absent: as soon as placed.")
    start_in = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DURATION_MS,
                                        help_text="Start this many ms after now (server clock).")
    at_earliest = serializers.BooleanField(
        required=False, default=False,
        help_text="Book the earliest window from the start (or now) where it fits; refused "
                  "when there is none.")
    before = serializers.DateTimeField(
        required=False, help_text="With atEarliest: the window must end by then.")
    before_in = serializers.IntegerField(
        required=False, min_value=1_000, max_value=MAX_DURATION_MS,
        help_text="With atEarliest: end by this many ms after now.")
    nodes = serializers.IntegerField(
        required=False, default=1, min_value=1, max_value=64,
        help_text="Nodes, each with the devices asked: above 1, a gang, booked on that many "
                  "nodes together (close together: fewest racks, one rail) or not at all, "
                  "and active once every node holds its part.")
    binding = serializers.ChoiceField(choices=["hold"], default="hold")
    priority_class = serializers.RegexField(
        CLASS_NAME, required=False, default="normal", max_length=32,
        help_text="One of the pool's priority classes the tenant may use (high, normal, "
                  "preemptible, and the pool's own): pending requests of a higher class "
                  "are placed first.")
    idempotency_key = IdempotencyKeyField()


@endpoint("reservations", "create", returns=wire.RESERVATION,
          input=ReservationCreateIn, mutating=True,
          subject=pool_subject("reservation"),
          emits=(ReservationEvent.RESERVATION_PLACED, ReservationEvent.RESERVATION_BINDING,
                 ReservationEvent.RESERVATION_PENDING))
def reservations_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Reserve GPUs of one pool for a window: placed now, or pending until capacity frees."""
    data.pop("binding")
    models = data["devices"][0].pop("models", [])
    shape = shape_of(data)
    rsv = reservation_create(models=models,
        tenant=ctx.tenant, actor=ctx.principal, pool=ctx.subject, shape=shape,
        pool_id=data.pop("pool_id"), duration_ms=data.pop("duration"),
        start_in_ms=data.pop("start_in", None), before_in_ms=data.pop("before_in", None),
        **data)
    return present_reservation(rsv)


class ReservationIdIn(Input):
    reservation_id = PublicIdField("rsv")


@endpoint("reservations", "get", returns=wire.RESERVATION,
          input=ReservationIdIn, mutating=False, subject=RESERVATION)
def reservations_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One reservation, with its window, node and (once active) binding."""
    return present_reservation(ctx.subject)


class ReservationListIn(ListInput):
    pool_id = PublicIdField("pool", required=False)
    state = serializers.ChoiceField(choices=ReservationState.choices, required=False)


@endpoint("reservations", "list", returns=page_of(wire.RESERVATION),
          input=ReservationListIn, mutating=False)
def reservations_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Reservations of the tenant, oldest first."""
    queryset = selectors.reservation_list(tenant=ctx.tenant, pool_id=data.pop("pool_id", None),
                                          state=data.pop("state", None))
    return page(queryset.prefetch_related("allocations"), present=present_reservation, **data)


class ReservationReleaseIn(ReservationIdIn):
    cancel = serializers.BooleanField(required=False, default=False,
                                      help_text="Only withdraw one that has not started.")


@endpoint("reservations", "release", returns=wire.RESERVATION,
          input=ReservationReleaseIn, mutating=True,
          subject=RESERVATION,
          emits=(ReservationEvent.RESERVATION_RELEASED, ReservationEvent.RESERVATION_CANCELLED))
def reservations_release(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """End a reservation now (or withdraw one that has not started); quota is refunded.

    The freed capacity is offered to the pool's pending reservations by a worker.
    """
    return present_reservation(reservation_release(
        tenant=ctx.tenant, actor=ctx.principal, reservation_id=ctx.subject.id,
        cancel=data["cancel"]))


class ReservationExtendIn(ReservationIdIn):
    by = serializers.IntegerField(min_value=-MAX_DURATION_MS, max_value=MAX_DURATION_MS,
                                  help_text="Milliseconds to add (negative shortens).")


@endpoint("reservations", "extend", returns=wire.RESERVATION,
          input=ReservationExtendIn, mutating=True,
          subject=RESERVATION,
          emits=(ReservationEvent.RESERVATION_EXTENDED,))
def reservations_extend(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Move a reservation's end; refused with the blocking window if the GPUs are booked."""
    return present_reservation(reservation_extend(
        tenant=ctx.tenant, actor=ctx.principal, reservation_id=ctx.subject.id,
        by_ms=data["by"]))
