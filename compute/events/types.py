"""Every event type, in one enum: emitters name a member, `events list --types` checks its
globs against it. A retired type is kept (commented as such), never reused."""

from __future__ import annotations

import re

from django.db import models

from compute.errors import InvalidArgument


class EventType(models.TextChoices):
    TENANT_CREATED = "tenant.created"
    TOKEN_CREATED = "token.created"
    TOKEN_REVOKED = "token.revoked"
    USER_CREATED = "user.created"
    SITE_CREATED = "site.created"
    POOL_CREATED = "pool.created"
    POOL_OFFERED = "pool.offered"
    OFFERING_UPDATED = "offering.updated"
    JOIN_TOKEN_CREATED = "join_token.created"
    JOIN_TOKEN_REVOKED = "join_token.revoked"
    NODE_JOINED = "node.joined"
    NODE_CONNECTED = "node.connected"
    NODE_RECONNECTED = "node.reconnected"
    NODE_UNREACHABLE = "node.unreachable"
    NODE_JOURNAL_LOST = "node.journal.lost"
    NODE_INVENTORY_UPDATED = "node.inventory.updated"
    DEVICE_UNHEALTHY = "device.unhealthy"
    DEVICE_HEALTHY = "device.healthy"
    NODE_ACCEPTANCE_STARTED = "node.acceptance.started"
    NODE_ACCEPTANCE_FAILED = "node.acceptance.failed"
    NODE_ADOPTED = "node.adopted"
    NODE_CORDONED = "node.cordoned"
    NODE_UNCORDONED = "node.uncordoned"
    NODE_MAINTENANCE_SCHEDULED = "node.maintenance.scheduled"
    NODE_MAINTENANCE_CANCELLED = "node.maintenance.cancelled"
    NODE_ENROLLED = "node.enrolled"
    NODE_PROVISION_STATE = "node.provision_state"
    NODE_BMC_UNREACHABLE = "node.bmc.unreachable"
    NODE_BMC_REACHABLE = "node.bmc.reachable"
    NODE_POWER_REQUESTED = "node.power.requested"
    NODE_POWER = "node.power"
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
    IMAGE_CREATED = "image.created"
    IMAGE_DELETED = "image.deleted"


def _type_globs_pattern() -> str:
    """`*`, a type, or a group of them (`node.*`, `node.acceptance.*`), comma-separated."""
    forms = {r"\*"} | {re.escape(t) for t in EventType.values}
    for known in EventType.values:
        parts = known.split(".")
        forms |= {re.escape(".".join(parts[:n])) + r"\.\*" for n in range(1, len(parts))}
    item = f" *(?:{'|'.join(sorted(forms))}) *"
    return f"^(?:{item}(?:,{item})*)?$"


TYPE_GLOBS = _type_globs_pattern()
TYPE_GLOBS_HELP = ("`*`, an event type, or a group such as `node.*`, comma-separated "
                   f"(known: {', '.join(EventType.values)})")


def parse_type_globs(types: str | None) -> list[str]:
    """`node.*,reservation.placed` as a list of globs, each `*`, a type or a group."""
    if not re.fullmatch(TYPE_GLOBS, types or ""):
        raise InvalidArgument(f"types: {TYPE_GLOBS_HELP}", field="types")
    return [t.strip() for t in (types or "").split(",") if t.strip()]
