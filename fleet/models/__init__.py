from fleet.models.devices import Device, DeviceClass
from fleet.models.nodes import SCHEDULABLE, Connectivity, Health, Node, ProvisionState
from fleet.models.pools import Pool, PoolClass
from fleet.models.sites import Site

__all__ = ["SCHEDULABLE", "Connectivity", "Device", "DeviceClass", "Health", "Node", "Pool",
           "PoolClass", "ProvisionState", "Site"]
