"""Binding: at the start of its window a placed reservation's GPUs go into the node's desired
state; only the node's own signed AllocationBound makes the reservation active.

The gateway relays the report but cannot forge it: the signature is checked here against
the public key the node joined with, and the GPU list against what the ledger booked.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from audit.services import audit_record, audited
from bcd.contract.crypto import verify_bytes
from compute.core.db import database_now
from compute.core.metrics import BIND_SECONDS
from compute.platform.events.services import event_emit
from fleet.models import Connectivity, Node
from fleet.reports import ReportRefused, StaleReport
from fleet.services.sessions import node_report_refused
from fleet.services.specs import node_spec_change_locked
from reservations.events import ReservationEvent
from reservations.models import Allocation, Reservation, ReservationState
from reservations.services.book import try_place
from reservations.services.booking import emit_pending, emit_placed, gang_of
from reservations.services.gang import (
    MAX_GANG_REPLACEMENTS,
    gang_bound,
    gang_place,
    gang_placed_again,
    locked_members,
)
from reservations.services.holds import bind_hold, hold_of
from reservations.services.release import end_reservation, free_allocation
from reservations.states import transition

TIMEOUT_REASON = "no AllocationBound within the timeout"


class BindingRefused(ReportRefused):
    """A report that does not prove what it claims; the reason goes to the audit trail."""


# A bound report is stale (StaleReport) when it binds an allocation that has ended since: a
# node says again what it holds on each new session, and after the first spec its process
# applies.


@audited
def reservation_bind(*, reservation_id: str) -> Reservation | None:
    """placed -> binding: add the hold to the node's desired state (next generation)."""
    rsv = (Reservation.objects.select_for_update(no_key=True, skip_locked=True)
           .filter(pk=reservation_id, state=ReservationState.PLACED).first())
    now = database_now()
    if rsv is None or rsv.during is None or rsv.during.lower > now:
        return None
    allocation = rsv.allocations.get(ended_at__isnull=True)
    data = bind_hold(rsv, allocation, now)
    if data is None:
        return None  # what held these GPUs before has not been released yet: bind later
    audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.bind",
                 target=rsv.id, data=data, reason="window started")
    return rsv


def verified_report(node_id: str, body: str, signature: str) -> tuple[Node, dict[str, Any]]:
    node = Node.objects.get(pk=node_id)
    if not node.public_key or not verify_bytes(node.public_key, body.encode(), signature):
        raise BindingRefused(f"not signed by {node_id}'s key")
    payload = json.loads(body)
    if payload.get("nodeId") != node_id:
        raise BindingRefused("the report names another node")
    return node, payload


def allocation_bound_record(*, node_id: str, body: str, signature: str) -> Reservation:
    """binding -> active, once the node proved (signed) it holds exactly the booked GPUs.

    A report that proves nothing changes nothing; its refusal is audited with the reason.
    """
    try:
        return _bind(node_id, body, signature)
    except BindingRefused as refusal:
        node_report_refused(node_id=node_id, action="reservation.activate",
                            reason=str(refusal))
        raise


@audited
def _bind(node_id: str, body: str, signature: str) -> Reservation:
    node, payload = verified_report(node_id, body, signature)
    allocation = (Allocation.objects.filter(pk=payload.get("allocationId"), node=node)
                  .annotate(gang_id=F("reservation__gang_id")).first())
    if allocation is None:
        raise BindingRefused("no live allocation of this node has that id")
    if allocation.ended_at is not None:
        raise StaleReport(f"{allocation.id} has ended since its node held it")
    members = locked_members(allocation.reservation_id, allocation.gang_id)
    rsv = next(m for m in members if m.id == allocation.reservation_id)
    hold = hold_of(allocation, rsv)
    if sorted(payload.get("cdiDevices", [])) != hold.cdi_devices \
            or sorted(payload.get("shares", [])) != list(hold.shares):
        raise BindingRefused("the node holds other GPUs than the ledger booked")
    if rsv.state == ReservationState.ACTIVE:
        return rsv
    if rsv.state != ReservationState.BINDING:
        raise BindingRefused(f"reservation {rsv.id} is {rsv.state}, not binding")
    binding = hold.binding()
    parent = payload.get("cgroupParent")  # the slice, or where systemd does not run, the path
    rsv.binding = {"nodeId": node_id, "cdiDevices": binding["cdiDevices"],
                   "envFile": node.simulated_root.rstrip("/") + binding["envFile"],
                   "cgroupParent": parent if parent == hold.cgroupfs_path
                   else binding["cgroupParent"],
                   "cdiSource": str(payload.get("cdiSource") or "")[:300],
                   "simulated": bool(node.simulated_root),
                   **({"shares": list(hold.shares)} if hold.shares else {})}
    if not gang_bound(members):  # a gang's member waits for the others' nodes
        rsv.save(update_fields=["binding"])
        audit_record(tenant_id=rsv.tenant_id, actor_id=node_id, action="reservation.bound",
                     target=rsv.id, data={"allocationId": allocation.id, "gangId": rsv.gang_id},
                     reason="signed by node; the gang's other members are not held yet")
        return rsv
    for member in members:
        if member.state == ReservationState.BINDING:
            _activate(member, allocation if member is rsv else
                      member.allocations.get(ended_at__isnull=True))
    audit_record(tenant_id=rsv.tenant_id, actor_id=node_id, action="reservation.activate",
                 target=rsv.id, reason="signed by node",
                 data={"allocationId": allocation.id,
                       **({"gangId": rsv.gang_id, "members": [m.id for m in members]}
                          if rsv.gang_id else {})})
    return rsv


def _activate(rsv: Reservation, allocation: Allocation) -> None:
    """binding -> active, for a reservation whose node reported its hold (every member's
    node, for a gang)."""
    transition(rsv, ReservationState.ACTIVE)
    rsv.save(update_fields=["binding", "state"])
    if rsv.placed_at is not None:
        waited = (timezone.now() - rsv.placed_at).total_seconds()
        transaction.on_commit(lambda: BIND_SECONDS.observe(max(0.0, waited)))
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_ACTIVE, subject=rsv.id,
               payload={"nodeId": allocation.node_id, "allocationId": allocation.id,
                        **gang_of(rsv)})


@audited
def allocation_released_record(*, node_id: str, body: str, signature: str) -> str:
    """The node gave an allocation's GPUs back (signed), and says what it did with the
    workloads still on them: stopped (the pool fences) or left running (it notifies)."""
    node, payload = verified_report(node_id, body, signature)
    node = Node.objects.select_related("pool").get(pk=node.pk)
    allocation_id = str(payload.get("allocationId", ""))[:32]
    allocation = (Allocation.objects.filter(pk=allocation_id, node=node)
                  .select_related("reservation").first())
    workloads = workloads_said(payload.get("workloads"))
    audit_record(tenant_id=node.pool.tenant_id, actor_id=node_id, action="allocation.release",
                 target=allocation_id, data={"workloads": workloads} if workloads else None,
                 reason="signed by node" if allocation else (
                     "signed by node; the ledger has no such allocation (booked after the "
                     "point it was restored to, or never): the node dropped its hold"))
    said = {"nodeId": node_id, **({"workloads": workloads} if workloads else {})}
    event_emit(tenant_id=node.pool.tenant_id, type=ReservationEvent.ALLOCATION_RELEASED,
               subject=allocation_id, payload={
                   **said, **({"reservationId": allocation.reservation_id} if allocation
                              else {})})
    if allocation and allocation.reservation.tenant_id != node.pool.tenant_id and workloads:
        event_emit(tenant_id=allocation.reservation.tenant_id,
                   type=ReservationEvent.ALLOCATION_RELEASED, subject=allocation_id,
                   payload={**said, "reservationId": allocation.reservation_id})
    return allocation_id


def workloads_said(said: object) -> dict[str, Any] | None:
    """The released report's `workloads`, kept to what it may say: pids, commands (cut to
    200 characters), why each was found and the signal that stopped it."""
    if not isinstance(said, dict) or said.get("onEnd") not in ("notify", "fence"):
        return None

    def listed(key: str) -> list[dict[str, Any]]:
        entries = said.get(key)
        return [{"pid": int(e["pid"]), "command": str(e.get("command", ""))[:200],
                 "why": str(e.get("why", ""))[:60],
                 **({"signal": str(e["signal"])[:8]} if "signal" in e else {})}
                for e in (entries if isinstance(entries, list) else [])[:64]
                if isinstance(e, dict) and isinstance(e.get("pid"), int)]

    kept = {"onEnd": said["onEnd"], **{key: listed(key) for key in (
        ("stopped", "survived") if said["onEnd"] == "fence" else ("running",))}}
    return kept if any(kept[k] for k in kept if k != "onEnd") else None


MAX_PLACEMENTS = 3  # the first placement and at most two more after failed bindings
def binding_timeout() -> timedelta:
    return timedelta(seconds=settings.BC_BINDING_TIMEOUT_SECONDS)


def binding_overdue(now: datetime) -> Q:
    """Bindings past their timeout, not counting while their node is unreachable: a binding
    waits while its node is silent (nothing moves for a node's silence alone), and a
    node that comes back has the whole timeout again to report the hold."""
    cutoff = now - binding_timeout()
    # A gang's member whose node reported waits for the others: it is not overdue itself.
    return Q(state=ReservationState.BINDING, binding_started_at__lt=cutoff,
             binding__isnull=True) & Q(Exists(
        Allocation.objects.filter(reservation=OuterRef("pk"), ended_at__isnull=True)
        .exclude(node__connectivity=Connectivity.UNREACHABLE)
        .filter(Q(node__connected_at__isnull=True) | Q(node__connected_at__lt=cutoff))))


@audited
def binding_fail(*, reservation_id: str, reason: str) -> Reservation | None:
    """A hold that failed on its node (or never reported): place it again elsewhere, at
    most twice; then the reservation fails and its quota is refunded. Nothing is metered
    for GPUs that were never held."""
    members = locked_members(reservation_id)
    rsv = next((m for m in members if m.id == reservation_id), None)
    if rsv is None or rsv.state != ReservationState.BINDING:
        return rsv
    now = database_now()
    allocation = rsv.allocations.get(ended_at__isnull=True)
    failed_node = allocation.node_id
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_BINDING_FAILED,
               subject=rsv.id, payload={"nodeId": failed_node, "reason": reason,
                                        "attempt": rsv.placement_attempts, **gang_of(rsv)})
    audit = {"nodeId": failed_node, "attempt": rsv.placement_attempts, **gang_of(rsv)}
    if rsv.gang_id:
        outcome = gang_member_failed(rsv, members, allocation, reason, now)
        audit_record(tenant_id=rsv.tenant_id, actor_id="system",
                     action="reservation.binding_fail", target=rsv.id, reason=reason,
                     data={**audit, "outcome": outcome})
        return rsv
    if rsv.placement_attempts >= MAX_PLACEMENTS:
        end_reservation(rsv, to=ReservationState.FAILED, now=now,
                        reason=f"binding failed {rsv.placement_attempts} times: {reason}")
        audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.binding_fail",
                     target=rsv.id, data={**audit, "outcome": "failed"}, reason=reason)
        return rsv
    node = Node.objects.select_for_update(no_key=True).get(pk=failed_node)
    node_spec_change_locked(node, remove=allocation.id)
    free_allocation(allocation, now, keep_history=False)
    transition(rsv, ReservationState.PENDING)
    rsv.during, rsv.placed_at, rsv.binding_started_at = None, None, None
    rsv.failure_reason = reason
    rsv.save(update_fields=["state", "during", "placed_at", "binding_started_at",
                            "failure_reason"])
    tried = set(rsv.allocations.values_list("node_id", flat=True))  # nodes that failed it
    placed = try_place(rsv, rsv.pool, now, excluded=tried)
    if placed is not None:  # placed again: the reason it had to be is still worth showing
        rsv.failure_reason = reason
        rsv.save(update_fields=["failure_reason"])
    if placed is None:
        emit_pending(rsv)
    else:
        emit_placed(rsv, placed)
    audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.binding_fail",
                 target=rsv.id, reason=reason,
                 data={**audit, "outcome": "pending" if placed is None else "placed"})
    return rsv


def allocation_failed_record(*, node_id: str, body: str, signature: str) -> Reservation | None:
    """The node says (signed) it could not hold an allocation."""
    node, payload = verified_report(node_id, body, signature)
    allocation = Allocation.objects.filter(pk=payload.get("allocationId"), node=node,
                                           ended_at__isnull=True).first()
    if allocation is None:
        return None
    return binding_fail(reservation_id=allocation.reservation_id,
                        reason=str(payload.get("reason", "failed"))[:200])


def unplace(rsv: Reservation, now: datetime) -> None:
    """Take a placed or binding reservation off its node, as if never placed: its hold
    leaves the node's desired state, its bookings vanish, and it is pending again."""
    allocation = rsv.allocations.get(ended_at__isnull=True)
    if rsv.state == ReservationState.BINDING:
        node = Node.objects.select_for_update(no_key=True).get(pk=allocation.node_id)
        node_spec_change_locked(node, remove=allocation.id)
    free_allocation(allocation, now, keep_history=False)
    transition(rsv, ReservationState.PENDING)
    rsv.during, rsv.placed_at, rsv.binding_started_at, rsv.binding = None, None, None, None
    rsv.save(update_fields=["state", "during", "placed_at", "binding_started_at", "binding"])


def gang_member_failed(rsv: Reservation, members: list[Reservation], allocation: Allocation,
                       reason: str, now: datetime) -> str:
    """A gang's member whose node failed its hold (or never reported it): placed again on
    a node the gang does not use, for the rest of the gang's window, within its retry
    budget; else the whole gang is placed again away from the nodes that failed it, at
    most MAX_GANG_REPLACEMENTS times before the gang fails. Returns what became of it."""
    end = rsv.ends_at or now
    unplace(rsv, now)
    tried = set(rsv.allocations.values_list("node_id", flat=True))
    rsv.failure_reason = reason[:300]
    if rsv.placement_attempts < MAX_PLACEMENTS:
        used = set(Allocation.objects.filter(reservation__gang_id=rsv.gang_id,
                                             ended_at__isnull=True)
                   .values_list("node_id", flat=True))
        placed = gang_place([rsv], rsv.pool, now, during=DateTimeTZRange(now, end, "[)"),
                            excluded=tried | used)
        if placed is not None:
            rsv.failure_reason = reason[:300]
            rsv.save(update_fields=["failure_reason"])
            emit_placed(rsv, placed[0])
            return "placed"
    for member in members:
        if member is not rsv and member.state in (ReservationState.PLACED,
                                                  ReservationState.BINDING):
            unplace(member, now)
    placements = gang_placed_again(str(rsv.gang_id))
    if placements > MAX_GANG_REPLACEMENTS:
        end_reservation(rsv, to=ReservationState.FAILED, now=now,
                        reason=f"the gang was placed {placements} times: {reason}")
        return "gang failed"
    allocations = gang_place(members, rsv.pool, now, excluded=tried)
    for index, member in enumerate(members):
        if allocations is None:
            emit_pending(member)
        else:
            emit_placed(member, allocations[index])
    return "gang pending" if allocations is None else "gang placed"
