"""A reservation's hold in its node's desired state: what the spec carries, and the step
placed -> binding inside the caller's transaction (the worker's at the window's start, or
the create call's own when the window starts at once)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from bcd.contract.holds import Claims, Hold, SlurmPublish
from compute.platform.events.services import event_emit
from fleet.models import Device, DeviceClass, Node
from fleet.services.specs import node_spec_change_locked
from reservations.events import ReservationEvent
from reservations.models import Allocation, Reservation, ReservationState
from reservations.services.notices import NOTICES
from reservations.states import transition


def hold_of(allocation: Allocation, rsv: Reservation) -> Hold:
    """The hold as the node's spec carries it: ids and GPU or MIG UUIDs only (the node
    derives every path and unit name from the allocation id); a share is held as its GPU,
    and named among the hold's shares. It carries the reservation's end, and a preempted
    hold its deadline."""
    booked = allocation.bookings.values_list("device__uuid", "device__device_class",
                                             "gpu__uuid")
    shares = sorted(uuid for uuid, kind, _ in booked if kind == DeviceClass.SHARE)
    gpus = sorted({gpu if kind == DeviceClass.SHARE else uuid for uuid, kind, gpu in booked})
    policy = rsv.pool.policy
    return Hold(allocation.id, rsv.id, tuple(gpus), rsv.kubernetes, tuple(shares),
                rsv.preempt_at.isoformat() if rsv.preempt_at else "", slurm_of(rsv),
                rsv.ends_at.isoformat() if rsv.ends_at else "",
                policy.get("onEnd", "notify"), float(policy.get("fenceGraceSeconds", 10.0)),
                tuple(sorted((float(n) for n in policy.get("endingNotices", NOTICES)),
                             reverse=True)))


def slurm_of(rsv: Reservation) -> SlurmPublish | None:
    """Where the hold is published in Slurm: the reservation's account, the partition the
    pool's policy names, until the window's end."""
    if not rsv.slurm_account:
        return None
    policy = rsv.pool.policy.get("slurm") or {}
    until = rsv.ends_at or timezone.now()  # a placed reservation has its window
    return SlurmPublish(rsv.slurm_account, policy.get("partition", ""), until.isoformat())


def still_held(node: Node, hold: Hold) -> bool:
    """Whether the node's desired state still names another hold on one of these GPUs (a
    reservation whose window ended there and that is not released yet). A spec naming both
    would be refused by the node as an overlap, so the binding waits for the release: the
    reconciler releases what ended first, and the sweep brings the binding back. Judged by
    the node's own `Claims` (two shares of one GPU may be held at once; a whole GPU and a
    part of it may not)."""
    latest = node.specs.order_by("-generation").values_list("spec", flat=True).first()
    others = [Hold.from_wire(entry) for entry in (latest or {}).get("allocations", [])
              if entry.get("allocationId") != hold.allocation_id]
    if not others:
        return False
    held = {uuid for each in [hold, *others] for uuid in each.gpus}
    claims = Claims(present=held, parent=dict(
        Device.objects.filter(uuid__in=held, parent__isnull=False)
        .values_list("uuid", "parent__uuid")))
    for other in others:
        claims.take(other.allocation_id, other)
    return claims.take(hold.allocation_id, hold) == "overlap"


def bind_hold(rsv: Reservation, allocation: Allocation, now: datetime) -> dict[str, Any] | None:
    """placed -> binding: the hold goes into the node's next generation, and the
    `reservation.binding` event out; returns what the caller audits. None (nothing written)
    while what held these GPUs before is still in the node's spec: bind later."""
    node = Node.objects.select_for_update(no_key=True).get(pk=allocation.node_id)
    hold = hold_of(allocation, rsv)
    if still_held(node, hold):
        return None
    spec = node_spec_change_locked(node, add=hold.wire())
    transition(rsv, ReservationState.BINDING)
    rsv.binding_started_at = now
    rsv.save(update_fields=["state", "binding_started_at"])
    data = {"nodeId": node.id, "allocationId": allocation.id, "generation": spec.generation}
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_BINDING, subject=rsv.id,
               payload=data)
    return data
