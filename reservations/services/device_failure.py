"""What a GPU that turned unhealthy does to the reservations booking it, by pool policy
`onDeviceFailure`: `keep` (the default) leaves every booking where it is; `replace-future`
places the reservations that have not started again, on healthy GPUs, before their start.
A reservation that holds the GPU now is flagged, never moved behind its user's back."""

from __future__ import annotations

from datetime import datetime

from audit.services import audit_record, audited
from compute.core.db import database_now
from compute.platform.events.services import event_emit
from fleet.models import Device
from reservations.events import ReservationEvent
from reservations.models import Reservation, ReservationState
from reservations.services.booking import emit_pending, emit_placed
from reservations.services.gang import locked_members
from reservations.services.release import place_again


def _locked(reservation_id: str) -> Reservation | None:
    """The reservation's row locked (and every member's, for a gang)."""
    return next((m for m in locked_members(reservation_id) if m.id == reservation_id), None)


def _books(rsv: Reservation, device_id: str) -> bool:
    return rsv.allocations.filter(ended_at__isnull=True, bookings__device_id=device_id).exists()


def _holds_now(rsv: Reservation, now: datetime) -> bool:
    if rsv.state in (ReservationState.BINDING, ReservationState.ACTIVE):
        return True
    return rsv.state == ReservationState.PLACED and rsv.during is not None \
        and rsv.during.lower <= now


@audited
def reservation_replace_off_device(*, reservation_id: str, device: Device) -> Reservation | None:
    """Place a not-yet-started reservation again, away from `device` (pending when nothing
    healthy fits before its start; the pending path retries as capacity frees)."""
    rsv = _locked(reservation_id)
    now = database_now()
    if rsv is None or rsv.state != ReservationState.PLACED or rsv.during is None \
            or rsv.during.lower <= now or not _books(rsv, device.id):
        return rsv
    allocation, placed = place_again(rsv, now)
    reason = f"GPU {device.uuid} unhealthy: {device.health_reason or 'reported by its node'}"
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_REPLACED, subject=rsv.id,
               payload={"deviceId": device.id, "fromNode": allocation.node_id,
                        "toNode": placed.node_id if placed else None, "reason": reason})
    if placed is not None:
        emit_placed(rsv, placed)
    else:
        rsv.failure_reason = f"{reason}; waiting for healthy GPUs"[:300]
        rsv.save(update_fields=["failure_reason"])
        emit_pending(rsv)
    audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.replace",
                 target=rsv.id, reason=reason,
                 data={"deviceId": device.id, "fromNode": allocation.node_id,
                       "outcome": "placed" if placed else "pending"})
    return rsv


@audited
def reservation_flag_device(*, reservation_id: str, device: Device) -> Reservation | None:
    """A reservation holding `device` now (binding it, or whose window began before its
    binding did): flagged with an event and an audit row, never moved."""
    rsv = _locked(reservation_id)
    if rsv is None or not _holds_now(rsv, database_now()) or not _books(rsv, device.id):
        return rsv
    reason = f"GPU {device.uuid} unhealthy: {device.health_reason or 'reported by its node'}"
    event_emit(tenant_id=rsv.tenant_id, type=ReservationEvent.RESERVATION_DEVICE_UNHEALTHY,
               subject=rsv.id, payload={"deviceId": device.id, "nodeId": device.node_id,
                                        "reason": reason})
    audit_record(tenant_id=rsv.tenant_id, actor_id="system", action="reservation.flag",
                 target=rsv.id, reason=reason, data={"deviceId": device.id})
    return rsv
