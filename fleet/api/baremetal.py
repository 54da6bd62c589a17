"""API methods for bare metal: nodes.enroll, verify, inspect, power, deploy, undeploy,
abort."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from fleet import presenters as wire
from fleet.api.nodes import NODE, NodeIdIn, NodeReasonIn
from fleet.events import FleetEvent
from fleet.presenters import present_node
from fleet.selectors import access_pool_by_id
from fleet.services.baremetal import (
    POWER_STATES,
    node_abort,
    node_enroll,
    node_inspect,
    node_power,
    node_verify,
)
from fleet.services.deploy import node_deploy, node_undeploy


class BmcCredentialsIn(Input):
    username = serializers.CharField(max_length=128)
    password = serializers.CharField(max_length=512, trim_whitespace=False,
                                     style={"input_type": "password"})


class NodeEnrollIn(Input):
    pool_id = PublicIdField("pool")
    bmc = serializers.CharField(max_length=300, help_text="redfish+https://HOST[:PORT]"
                                                         "/redfish/v1/Systems/ID")
    credentials = BmcCredentialsIn(help_text="Sealed at rest; never returned or logged.")
    verify_ca = serializers.CharField(required=False, default="", max_length=65536,
                                      help_text="A PEM bundle the BMC's certificate must "
                                                "chain to (default: the system's CAs).")
    insecure = serializers.BooleanField(required=False, default=False,
                                        help_text="Do not check the BMC's certificate.")
    hostname = serializers.CharField(required=False, default="", max_length=253)


@endpoint("nodes", "enroll", returns=wire.NODE, input=NodeEnrollIn, mutating=True,
          subject=Subject("pool", access_pool_by_id, "pool_id", options={"owned": True}),
          emits=(FleetEvent.NODE_ENROLLED, FleetEvent.NODE_PROVISION_STATE))
def nodes_enroll(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Enroll a machine by its BMC; the site's provisioner verifies, then inspects it."""
    credentials = data.pop("credentials")
    return present_node(node_enroll(tenant=ctx.tenant, actor=ctx.principal, **data,
                                    username=credentials["username"],
                                    password=credentials["password"]))


@endpoint("nodes", "verify", returns=wire.NODE, input=NodeIdIn, mutating=True, subject=NODE,
          emits=(FleetEvent.NODE_PROVISION_STATE,))
def nodes_verify(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Check again that an enrolled machine's BMC answers (after verify-failed)."""
    return present_node(node_verify(tenant=ctx.tenant, actor=ctx.principal, **data))


@endpoint("nodes", "inspect", returns=wire.NODE, input=NodeIdIn, mutating=True, subject=NODE,
          emits=(FleetEvent.NODE_PROVISION_STATE,))
def nodes_inspect(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Read a machine's identity and size from its BMC again."""
    return present_node(node_inspect(tenant=ctx.tenant, actor=ctx.principal, **data))


class NodePowerIn(NodeIdIn):
    state = serializers.ChoiceField(choices=POWER_STATES)
    reason = serializers.CharField(required=False, default="", max_length=300,
                                   allow_blank=True)


@endpoint("nodes", "power", returns=wire.NODE, input=NodePowerIn, mutating=True, subject=NODE,
          emits=(FleetEvent.NODE_POWER_REQUESTED,))
def nodes_power(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Power a machine on, off or cycle it through its BMC (answered once queued)."""
    return present_node(node_power(tenant=ctx.tenant, actor=ctx.principal, **data))


class NodeDeployIn(NodeIdIn):
    image = serializers.CharField(max_length=63, help_text="The image (name or id) whose "
                                                           "disk is written to the machine.")
    ramdisk = serializers.CharField(required=False, default="", max_length=63,
                                    help_text="The deploy ramdisk image (default: the pool's "
                                              "bmc.deployRamdisk).")
    timeout = serializers.IntegerField(required=False, default=1_800_000, min_value=60_000,
                                       max_value=86_400_000,
                                       help_text="Milliseconds for the OS to write and join.")


@endpoint("nodes", "deploy", returns=wire.NODE, input=NodeDeployIn, mutating=True,
          subject=NODE, emits=(FleetEvent.NODE_PROVISION_STATE,))
def nodes_deploy(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Write an image to a machine through the deploy ramdisk; it is adopted when the
    OS's agent joins and passes acceptance."""
    data["timeout"] = timedelta(milliseconds=data["timeout"])
    return present_node(node_deploy(tenant=ctx.tenant, actor=ctx.principal, **data))


@endpoint("nodes", "undeploy", returns=wire.NODE, input=NodeReasonIn, mutating=True,
          subject=NODE, emits=(FleetEvent.NODE_PROVISION_STATE,))
def nodes_undeploy(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Eject the media and power a deployed machine off: available again (refused while it
    holds reservations or sandboxes)."""
    return present_node(node_undeploy(tenant=ctx.tenant, actor=ctx.principal, **data))


@endpoint("nodes", "abort", returns=wire.NODE, input=NodeReasonIn, mutating=True, subject=NODE,
          emits=(FleetEvent.NODE_PROVISION_STATE,))
def nodes_abort(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Stop a machine's provision step, or clear its failure: back to where it was."""
    return present_node(node_abort(tenant=ctx.tenant, actor=ctx.principal, **data))
