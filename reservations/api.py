"""API methods of the ledger: offerings, reservations, capacity, sandboxes, usage."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.api.drafts import object_draft
from compute.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.api.registry import CallContext, endpoint
from compute.paging import page
from compute.tenancy.selectors import tenant_by_ref
from fleet.models import Pool
from fleet.selectors import access_pool_by_id
from reservations import selectors
from reservations.capacity import capacity_preview, capacity_rollup
from reservations.device_filter import parse_selector
from reservations.ledger import Reservation, ReservationState, Topology
from reservations.sandboxes import Sandbox
from reservations.serializers import (
    present_offering,
    present_reservation,
    present_sandbox,
    present_usage,
)
from reservations.services.book import pending_place, reservation_create
from reservations.services.offerings import pool_offer
from reservations.services.release import reservation_extend, reservation_release
from reservations.services.sandboxes import sandbox_create, sandbox_release

MAX_DURATION_MS = 366 * 24 * 3_600_000


class PoolOfferIn(Input):
    pool_id = PublicIdField("pool")
    to = serializers.CharField(max_length=63, help_text="Tenant id or slug.")
    quota = serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=10**9),
                                  allow_empty=False, help_text="Such as {\"gpu\": 16}.")


def _pool_guard(ctx: CallContext, pool_id: str) -> Pool:
    return access_pool_by_id(tenant=ctx.tenant, pool_id=pool_id)


def _owned_pool_guard(ctx: CallContext, pool_id: str) -> Pool:
    return access_pool_by_id(tenant=ctx.tenant, pool_id=pool_id, owned=True)


@endpoint("pools", "offer", input=PoolOfferIn, mutating=True,
          draft=object_draft("pool", _owned_pool_guard, "pool_id"))
def pools_offer(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Offer a pool to a tenant with quotas (gpu for GPU pools; vcpu, memory for CPU pools)."""
    to = tenant_by_ref(data["to"])
    offering = pool_offer(tenant=ctx.tenant, actor=ctx.principal, pool_id=data["pool_id"],
                          to=to, quota=data["quota"])
    return present_offering(selectors.offering_list(tenant=ctx.tenant).get(pk=offering.pk))


@endpoint("offerings", "list", input=ListInput, mutating=False)
def offerings_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Offerings the tenant made or received, with quota use."""
    return page(selectors.offering_list(tenant=ctx.tenant), present=present_offering, **data)


class DeviceRequestIn(Input):
    device_class = serializers.ChoiceField(choices=["gpu"])
    count = serializers.IntegerField(min_value=1, max_value=64)
    topology = serializers.ChoiceField(choices=Topology.choices, default=Topology.ANY)
    aliases = {"class": "device_class"}


class RequestShapeIn(Input):
    """What a reservation asks for; shared by reservations.create and capacity.preview."""

    pool_id = PublicIdField("pool")
    devices = DeviceRequestIn(many=True, min_length=1, max_length=1)
    duration = serializers.IntegerField(min_value=1_000, max_value=MAX_DURATION_MS,
                                        help_text="Milliseconds (at least 1 s).")
    model = serializers.CharField(required=False, default="", max_length=32, allow_blank=True)
    product = serializers.CharField(required=False, default="", max_length=96, allow_blank=True)
    selector = serializers.CharField(required=False, default="", max_length=300,
                                     allow_blank=True, help_text="e.g. vramGiB >= 80")
    kubernetes = serializers.BooleanField(required=False, default=False)


def shape_kwargs(data: dict[str, Any]) -> dict[str, Any]:
    device = data.pop("devices")[0]
    data["duration_ms"] = data.pop("duration")
    return {**data, "gpus": device["count"], "topology": device["topology"]}


class ReservationCreateIn(RequestShapeIn):
    start = serializers.DateTimeField(required=False, help_text="Absent: as soon as placed.")
    start_in = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DURATION_MS,
                                        help_text="Start this many ms after now (server clock).")
    binding = serializers.ChoiceField(choices=["hold"], default="hold")
    idempotency_key = IdempotencyKeyField()


def _pool_draft_kind(kind: str):
    return object_draft(kind, _pool_guard, "pool_id")


@endpoint("reservations", "create", input=ReservationCreateIn, mutating=True,
          draft=_pool_draft_kind("reservation"))
def reservations_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Reserve GPUs of one pool for a window: placed now, or pending until capacity frees."""
    data.pop("binding")
    kwargs = shape_kwargs(data)
    kwargs["start_in_ms"] = kwargs.pop("start_in", None)
    rsv = reservation_create(tenant=ctx.tenant, actor=ctx.principal, **kwargs)
    return present_reservation(_reservation_guard(ctx, rsv.id))


def _reservation_guard(ctx: CallContext, reservation_id: str) -> Reservation:
    return selectors.access_reservation_by_id(tenant=ctx.tenant,
                                              reservation_id=reservation_id)


class ReservationIdIn(Input):
    reservation_id = PublicIdField("rsv")


@endpoint("reservations", "get", input=ReservationIdIn, mutating=False,
          draft=object_draft("reservation", _reservation_guard, "reservation_id"))
def reservations_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One reservation, with its window, node and (once active) binding."""
    return present_reservation(_reservation_guard(ctx, data["reservation_id"]))


class ReservationListIn(ListInput):
    pool_id = PublicIdField("pool", required=False)
    state = serializers.ChoiceField(choices=ReservationState.choices, required=False)


@endpoint("reservations", "list", input=ReservationListIn, mutating=False)
def reservations_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Reservations of the tenant, oldest first."""
    queryset = selectors.reservation_list(tenant=ctx.tenant, pool_id=data.pop("pool_id", None),
                                          state=data.pop("state", None))
    return page(queryset.prefetch_related("allocations"), present=present_reservation, **data)


class ReservationReleaseIn(ReservationIdIn):
    cancel = serializers.BooleanField(required=False, default=False,
                                      help_text="Only withdraw one that has not started.")


@endpoint("reservations", "release", input=ReservationReleaseIn, mutating=True,
          draft=object_draft("reservation", _reservation_guard, "reservation_id"))
def reservations_release(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """End a reservation now (or withdraw one that has not started); quota is refunded.

    The freed capacity is offered to the pool's pending reservations right after.
    """
    rsv = reservation_release(tenant=ctx.tenant, actor=ctx.principal,
                              reservation_id=data["reservation_id"], cancel=data["cancel"])
    pending_place(pool_id=rsv.pool_id)
    return present_reservation(_reservation_guard(ctx, rsv.id))


class ReservationExtendIn(ReservationIdIn):
    by = serializers.IntegerField(min_value=-MAX_DURATION_MS, max_value=MAX_DURATION_MS,
                                  help_text="Milliseconds to add (negative shortens).")


@endpoint("reservations", "extend", input=ReservationExtendIn, mutating=True,
          draft=object_draft("reservation", _reservation_guard, "reservation_id"))
def reservations_extend(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Move a reservation's end; refused with the blocking window if the GPUs are booked."""
    rsv = reservation_extend(tenant=ctx.tenant, actor=ctx.principal,
                             reservation_id=data["reservation_id"], by_ms=data["by"])
    if data["by"] < 0:
        pending_place(pool_id=rsv.pool_id)
    return present_reservation(_reservation_guard(ctx, rsv.id))


class CapacityGetIn(Input):
    pool_id = PublicIdField("pool")


@endpoint("capacity", "get", input=CapacityGetIn, mutating=False,
          draft=_pool_draft_kind("pool"))
def capacity_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """A pool's capacity per resource: total, allocatable, allocated, reserved, available."""
    return capacity_rollup(_pool_guard(ctx, data["pool_id"]))


@endpoint("capacity", "preview", input=RequestShapeIn, mutating=False,
          draft=_pool_draft_kind("pool"))
def capacity_preview_(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Would this request fit now, where, with which host share? Books nothing."""
    kwargs = shape_kwargs(data)
    pool = _pool_guard(ctx, kwargs.pop("pool_id"))
    unsaved = Reservation(tenant=ctx.tenant, pool=pool, gpu_count=kwargs["gpus"],
                          topology=kwargs["topology"], duration_ms=kwargs["duration_ms"],
                          product=kwargs["product"], selector=kwargs["selector"])
    parse_selector(unsaved.selector)
    return capacity_preview(pool, unsaved)


class SandboxCreateIn(Input):
    pool_id = PublicIdField("pool")
    vcpus = serializers.IntegerField(min_value=1, max_value=1024)
    memory_gi_b = serializers.IntegerField(min_value=1, max_value=16384)
    name = serializers.CharField(required=False, default="", max_length=200, allow_blank=True)
    idempotency_key = IdempotencyKeyField()


@endpoint("sandboxes", "create", input=SandboxCreateIn, mutating=True,
          draft=_pool_draft_kind("sandbox"))
def sandboxes_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Claim vCPUs and memory on one node of a pool for a sandbox VM."""
    data["memory_gib"] = data.pop("memory_gi_b")
    return present_sandbox(sandbox_create(tenant=ctx.tenant, actor=ctx.principal, **data))


def _sandbox_guard(ctx: CallContext, sandbox_id: str) -> Sandbox:
    return selectors.access_sandbox_by_id(tenant=ctx.tenant, sandbox_id=sandbox_id)


class SandboxIdIn(Input):
    sandbox_id = PublicIdField("sbx")


@endpoint("sandboxes", "get", input=SandboxIdIn, mutating=False,
          draft=object_draft("sandbox", _sandbox_guard, "sandbox_id"))
def sandboxes_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One sandbox."""
    return present_sandbox(_sandbox_guard(ctx, data["sandbox_id"]))


@endpoint("sandboxes", "list", input=ListInput, mutating=False)
def sandboxes_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sandboxes of the tenant."""
    return page(selectors.sandbox_list(tenant=ctx.tenant), present=present_sandbox, **data)


@endpoint("sandboxes", "release", input=SandboxIdIn, mutating=True,
          draft=object_draft("sandbox", _sandbox_guard, "sandbox_id"))
def sandboxes_release(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Give back a sandbox's vCPUs and memory."""
    sandbox = sandbox_release(tenant=ctx.tenant, actor=ctx.principal,
                              sandbox_id=data["sandbox_id"])
    pending_place(pool_id=sandbox.pool_id)
    return present_sandbox(sandbox)


class UsageListIn(ListInput):
    meter = serializers.CharField(required=False, max_length=64)


@endpoint("usage", "list", input=UsageListIn, mutating=False)
def usage_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Metered usage of the tenant, such as gpu.H100.hours, per ended window."""
    queryset = selectors.usage_list(tenant=ctx.tenant, meter=data.pop("meter", None))
    return page(queryset, present=present_usage, **data)
