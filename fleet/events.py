"""The fleet's event types: sites, pools, join tokens, nodes, devices, images."""

from __future__ import annotations

from compute.platform.events.types import EventType, event_types


@event_types
class FleetEvent(EventType):
    SITE_CREATED = "site.created"
    POOL_CREATED = "pool.created"
    POOL_POLICY_UPDATED = "pool.policy.updated"
    JOIN_TOKEN_CREATED = "join_token.created"
    JOIN_TOKEN_REVOKED = "join_token.revoked"
    NODE_JOINED = "node.joined"
    NODE_CONNECTED = "node.connected"
    NODE_RECONNECTED = "node.reconnected"
    NODE_UNREACHABLE = "node.unreachable"
    NODE_JOURNAL_LOST = "node.journal.lost"
    NODE_AGENT_REFUSED = "node.agent.refused"
    NODE_SPEC_REBASED = "node.spec.rebased"
    NODE_INVENTORY_UPDATED = "node.inventory.updated"
    NODE_INVENTORY_REFUSED = "node.inventory.refused"
    DEVICE_UNHEALTHY = "device.unhealthy"
    DEVICE_HEALTHY = "device.healthy"
    NODE_ACCEPTANCE_STARTED = "node.acceptance.started"
    NODE_ACCEPTANCE_FAILED = "node.acceptance.failed"
    NODE_ADOPTED = "node.adopted"
    NODE_CORDONED = "node.cordoned"
    NODE_UNCORDONED = "node.uncordoned"
    NODE_RETIRED = "node.retired"
    NODE_ENROLLED = "node.enrolled"
    NODE_PROVISION_STATE = "node.provision_state"
    NODE_BMC_UNREACHABLE = "node.bmc.unreachable"
    NODE_BMC_REACHABLE = "node.bmc.reachable"
    NODE_POWER_REQUESTED = "node.power.requested"
    NODE_POWER = "node.power"
    IMAGE_CREATED = "image.created"
    IMAGE_DELETED = "image.deleted"
