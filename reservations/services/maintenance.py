"""Maintenance windows: a node takes no bookings for a window of time.

The window books every present GPU of the node for its span, so Postgres' EXCLUDE
constraint referees both ways: a window never lands on a booking, and no booking lands in a
window. Creating one that overlaps bookings is refused naming them; with `move`, the
bookings that have not started are placed again on other nodes first (all or nothing: one
that fits nowhere refuses the whole window). Bookings that hold the GPUs now, and live
sandboxes, are never moved behind their users' backs: a window that starts now is refused
while the node runs a sandbox, and no new sandbox lands inside a window.
"""

from __future__ import annotations

from datetime import datetime

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Exists, OuterRef

from audit.services import audit_record, audited
from compute.core.db import constraint_errors, database_now
from compute.core.errors import CapacityConflict, InvalidState
from compute.platform.events.services import event_emit
from compute.platform.tenancy.models import Principal, Tenant
from fleet.models import Device, DeviceClass, Node
from fleet.selectors import access_node_by_id
from fleet.services.nodes import node_event
from reservations.candidates import later_start, window
from reservations.constraints import LEDGER_CONSTRAINTS, bookings_refereed
from reservations.events import ReservationEvent
from reservations.models import (
    Allocation,
    Booking,
    MaintenanceWindow,
    Reservation,
    ReservationState,
    Sandbox,
)
from reservations.selectors import access_maintenance_by_id
from reservations.services.book import emit_placed
from reservations.services.release import place_again
from reservations.work import pool_replan


def in_maintenance(now: datetime) -> Exists:
    """A node filter: the node is inside a live maintenance window at `now`."""
    return Exists(MaintenanceWindow.objects.filter(node=OuterRef("pk"), during__contains=now,
                                                   cancelled_at__isnull=True))


@audited
def maintenance_create(*, tenant: Tenant, actor: Principal, node_id: str, duration_ms: int,
                       reason: str, start: datetime | None = None,
                       start_in_ms: int | None = None,
                       move: bool = False) -> tuple[MaintenanceWindow, dict[str, str]]:
    """Schedule a window (from `start` or `startIn`, or now); returns it and the
    reservations moved (id -> the node each went to)."""
    node = access_node_by_id(tenant=tenant, node_id=node_id)
    now = database_now()
    during = window(later_start(now, start, start_in_ms) or now, duration_ms)
    # The ledger's lock order: the reservations in the way, then the node (a release takes
    # them in that order too). A booking that lands in between is refused by the window's
    # own bookings below.
    in_the_way = Allocation.objects.filter(node=node, ended_at__isnull=True,
                                           bookings__during__overlap=during)
    overlapping = list(Reservation.objects.select_for_update(no_key=True, of=("self",))
                       .filter(pk__in=in_the_way.values("reservation_id")).order_by("id"))
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    sandboxes = list(Sandbox.objects.filter(node=node, ended_at__isnull=True)
                     .values_list("id", flat=True)[:20])
    if sandboxes and during.lower <= now:  # a later window leaves them time to be released
        raise CapacityConflict(f"node {node.id} runs sandbox(es) {', '.join(sandboxes)}: "
                               "release them first (sandboxes are never moved)",
                               sandboxes=sandboxes)
    started = [r.id for r in overlapping
               if r.state != ReservationState.PLACED or r.during.lower <= now]
    if started:
        raise CapacityConflict(f"the window overlaps reservation(s) holding the node now, "
                               f"which are never moved: {', '.join(started)}",
                               reservations=started)
    if overlapping and not move:
        ids = [r.id for r in overlapping]
        raise CapacityConflict(f"the window overlaps {len(ids)} booking(s): {', '.join(ids)}; "
                               "move them elsewhere (--move) or choose another window",
                               reservations=ids)
    moved = {rsv.id: _moved_off(rsv, node, now) for rsv in overlapping}
    held = MaintenanceWindow.objects.create(node=node, during=during, reason=reason,
                                            created_by=actor.id)
    gpus = Device.objects.filter(node=node, present=True, device_class=DeviceClass.GPU)
    with constraint_errors(LEDGER_CONSTRAINTS):  # a booking that raced in: try again
        Booking.objects.bulk_create(Booking(maintenance=held, device=gpu, during=during)
                                    for gpu in gpus)
        bookings_refereed(maintenance_id=held.id)
    data = {"windowId": held.id, "start": during.lower, "end": during.upper, "moved": moved}
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="node.maintenance",
                 target=node.id, reason=reason, data=data)
    node_event(node, ReservationEvent.NODE_MAINTENANCE_SCHEDULED, reason=reason, **data)
    return held, moved


def _moved_off(rsv: Reservation, node: Node, now: datetime) -> str:
    """Place a reservation that has not started again, on another node, or refuse."""
    _old, placed = place_again(rsv, now, excluded={node.id})
    if placed is None:
        raise CapacityConflict(f"reservation {rsv.id} cannot move off node {node.id}: "
                               f"{rsv.failure_reason}", reservations=[rsv.id])
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_REPLACED, subject=rsv.id,
               payload={"fromNode": node.id, "toNode": placed.node_id,
                        "reason": "maintenance of its node"})
    emit_placed(rsv, placed)
    return placed.node_id


@audited
def maintenance_cancel(*, tenant: Tenant, actor: Principal, window_id: str,
                       reason: str = "") -> MaintenanceWindow:
    """End a window now (or drop it before it starts): its GPUs take bookings again."""
    held = access_maintenance_by_id(tenant=tenant, window_id=window_id, lock=True)
    now = database_now()
    if held.cancelled_at is not None or held.during.upper <= now:
        raise InvalidState(f"maintenance window {held.id} is over", windowId=held.id)
    # The ledger's lock order: the node before its bookings, as a booker takes them. Dropped
    # bookings are refereed on the node's row at commit; without the row first, a booker
    # holding it and waiting on those bookings' EXCLUDE check deadlocked with this one.
    node = Node.objects.select_related("pool").select_for_update(no_key=True, of=("self",)).get(
        pk=held.node_id)
    held.cancelled_at = now
    held.save(update_fields=["cancelled_at"])
    if held.during.lower >= now:
        held.bookings.all().delete()
    else:  # it had begun: its history stays, ending now
        held.bookings.update(during=DateTimeTZRange(held.during.lower, now, "[)"))
    pool_replan(node.pool_id)  # what waited for these GPUs may fit now
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="node.maintenance.cancel",
                 target=node.id, reason=reason, data={"windowId": held.id})
    node_event(node, ReservationEvent.NODE_MAINTENANCE_CANCELLED, windowId=held.id, reason=reason)
    return held
