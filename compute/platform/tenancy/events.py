"""Tenancy's event types: tenants, API tokens, users."""

from __future__ import annotations

from compute.platform.events.types import EventType, event_types


@event_types
class TenancyEvent(EventType):
    TENANT_CREATED = "tenant.created"
    TOKEN_CREATED = "token.created"
    TOKEN_REVOKED = "token.revoked"
    USER_CREATED = "user.created"
