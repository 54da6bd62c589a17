"""The ledger's event types: offerings, maintenance windows, reservations, series, sandboxes."""

from __future__ import annotations

from compute.platform.events.types import EventType, event_types


@event_types
class ReservationEvent(EventType):
    POOL_OFFERED = "pool.offered"
    OFFERING_UPDATED = "offering.updated"
    NODE_MAINTENANCE_SCHEDULED = "node.maintenance.scheduled"
    NODE_MAINTENANCE_CANCELLED = "node.maintenance.cancelled"
    RESERVATION_PENDING = "reservation.pending"
    RESERVATION_PLACED = "reservation.placed"
    RESERVATION_BINDING = "reservation.binding"
    RESERVATION_ACTIVE = "reservation.active"
    RESERVATION_BINDING_FAILED = "reservation.binding_failed"
    RESERVATION_REPLACED = "reservation.replaced"
    RESERVATION_DEVICE_UNHEALTHY = "reservation.device_unhealthy"
    RESERVATION_EXTENDED = "reservation.extended"
    RESERVATION_IDLE = "reservation.idle"
    RESERVATION_BUSY = "reservation.busy"
    RESERVATION_RELEASED = "reservation.released"
    RESERVATION_CANCELLED = "reservation.cancelled"
    RESERVATION_FAILED = "reservation.failed"
    RESERVATION_PREEMPTING = "reservation.preempting"
    RESERVATION_PREEMPTION_WITHDRAWN = "reservation.preemption_withdrawn"
    RESERVATION_PLANNED = "reservation.planned"
    RESERVATION_STARTED_EARLIER = "reservation.started_earlier"
    SERIES_CREATED = "series.created"
    SERIES_EXTENDED = "series.extended"
    SERIES_OCCURRENCE_REFUSED = "series.occurrence_refused"
    SERIES_RELEASED = "series.released"
    ALLOCATION_RELEASED = "allocation.released"
    SANDBOX_CREATED = "sandbox.created"
    SANDBOX_STARTING = "sandbox.starting"
    SANDBOX_RUNNING = "sandbox.running"
    SANDBOX_RELEASED = "sandbox.released"
    SANDBOX_STOPPED = "sandbox.stopped"
    SANDBOX_FAILED = "sandbox.failed"
