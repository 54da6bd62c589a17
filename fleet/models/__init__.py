from fleet.models.agent import CommandState, NodeCommand, NodeReport, ReportInbox
from fleet.models.devices import Device, DeviceClass, GpuSample
from fleet.models.images import Image
from fleet.models.join_tokens import JoinToken
from fleet.models.nodes import (
    SCHEDULABLE,
    Connectivity,
    Health,
    Node,
    NodeRole,
    ProvisionState,
)
from fleet.models.pools import Pool, PoolClass
from fleet.models.seals import SpentSeal
from fleet.models.sites import Site
from fleet.models.specs import NodeSpec

__all__ = ["SCHEDULABLE", "CommandState", "Connectivity", "Device", "DeviceClass", "GpuSample",
           "Health", "Image", "JoinToken", "Node", "NodeCommand", "NodeReport", "NodeRole",
           "NodeSpec", "Pool", "PoolClass", "ProvisionState", "ReportInbox", "Site", "SpentSeal"]
