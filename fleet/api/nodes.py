"""API methods nodes.*."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import array, extended, items_of, page_of
from compute.platform.events.presenters import EVENT, present_event
from compute.platform.events.selectors import event_list
from compute.platform.paging import page
from fleet import presenters as wire
from fleet.events import FleetEvent
from fleet.presenters import DEVICE, present_device, present_node
from fleet.selectors import access_node_by_id, node_list
from fleet.services.lifecycle import node_adopt_again
from fleet.services.nodes import node_cordon, node_retire, node_uncordon

NODE = Subject("node", access_node_by_id, "node_id")


class NodeListIn(ListInput):
    pool_id = PublicIdField("pool", required=False)


@endpoint("nodes", "list", returns=page_of(wire.NODE), input=NodeListIn, mutating=False)
def nodes_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Nodes of the tenant's pools."""
    queryset = node_list(tenant=ctx.tenant, pool_id=data.pop("pool_id", None))
    return page(queryset, present=present_node, **data)


class NodeIdIn(Input):
    node_id = PublicIdField("node")


@endpoint("nodes", "get", returns=extended(wire.NODE, devices=array(DEVICE)),
          input=NodeIdIn, mutating=False, subject=NODE)
def nodes_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One node with its conditions and devices."""
    node = ctx.subject
    return {**present_node(node),
            "devices": [present_device(d) for d in node.devices.filter(present=True)]}


class NodeEventsIn(NodeIdIn):
    since = serializers.IntegerField(required=False, min_value=0, default=0)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=100)


@endpoint("nodes", "events", returns=items_of(EVENT),
          input=NodeEventsIn, mutating=False, subject=NODE)
def nodes_events(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Events about one node, oldest first."""
    rows = event_list(tenant=ctx.tenant, subject=ctx.subject.id, since=data["since"],
                      limit=data["limit"])
    return {"items": [present_event(row) for row in rows]}


class NodeCordonIn(NodeIdIn):
    reason = serializers.CharField(required=False, default="", max_length=300, allow_blank=True)


@endpoint("nodes", "cordon", returns=wire.NODE, input=NodeCordonIn, mutating=True, subject=NODE,
          emits=(FleetEvent.NODE_CORDONED,))
def nodes_cordon(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Stop placing on a node; what it holds stays."""
    return present_node(node_cordon(tenant=ctx.tenant, actor=ctx.principal, **data))


@endpoint("nodes", "uncordon", returns=wire.NODE, input=NodeCordonIn, mutating=True, subject=NODE,
          emits=(FleetEvent.NODE_UNCORDONED,))
def nodes_uncordon(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Let the placer use a node again."""
    return present_node(node_uncordon(tenant=ctx.tenant, actor=ctx.principal, **data))


class NodeReasonIn(NodeIdIn):
    """A node and why (adopt again, retire, and the provision steps that need a reason)."""

    reason = serializers.CharField(max_length=300)


@endpoint("nodes", "adopt", returns=wire.NODE, input=NodeReasonIn, mutating=True, subject=NODE,
          emits=(FleetEvent.NODE_ACCEPTANCE_STARTED, FleetEvent.NODE_ADOPTED))
def nodes_adopt(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Start a new acceptance attempt for a node whose acceptance failed."""
    return present_node(node_adopt_again(tenant=ctx.tenant, actor=ctx.principal, **data))


@endpoint("nodes", "retire", returns=wire.NODE, input=NodeReasonIn, mutating=True, subject=NODE,
          emits=(FleetEvent.NODE_RETIRED,))
def nodes_retire(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Take a node out of the fleet for good (refused while anything holds it)."""
    return present_node(node_retire(tenant=ctx.tenant, actor=ctx.principal, **data))
