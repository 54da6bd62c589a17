"""Node writes: creation, inventory, adoption, cordoning and retirement."""

from __future__ import annotations

from audit.services import audit_record, audited
from bcd.contract.holds import share_uuid
from compute.core.errors import Conflict, InvalidState
from compute.platform.events.services import event_emit
from compute.platform.events.types import EventType
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.holders import refuse_while_held
from fleet.inventory import GpuReport, InventoryReport
from fleet.models import (
    Device,
    DeviceClass,
    Health,
    Node,
    NodeRole,
    Pool,
    PoolClass,
    ProvisionState,
)
from fleet.selectors import access_node_by_id
from fleet.services.specs import node_spec_change_locked
from fleet.work import device_health_changed


class InventoryRefused(Conflict):
    code = "inventory_refused"


def node_event(node: Node, type_: EventType, **data: object) -> None:
    """An event about a node, in its pool owner's tenant (the caller audits its change)."""
    event_emit(tenant_id=node.pool.tenant_id, type=type_, subject=node.id,
               payload={"poolId": node.pool_id, **data})


def node_create_locked(*, pool: Pool, hostname: str = "", serial: str = "",
                       product_uuid: str = "", macs: tuple[str, ...] = (),
                       role: str = NodeRole.NODE) -> Node:
    """Create a node in `adopting` inside the caller's service (the join path)."""
    node = Node.objects.create(pool=pool, site_id=pool.site_id, hostname=hostname,
                               serial=serial, product_uuid=product_uuid, macs=list(macs),
                               role=role)
    node.pool = pool
    node_event(node, FleetEvent.NODE_JOINED, hostname=hostname, role=role)
    return node


def node_inventory_ingest_locked(node: Node, report: InventoryReport) -> dict[str, int]:
    """Record what a machine has and derive its devices, idempotently; returns a summary
    for the caller's audit row. The caller holds the node row's lock.

    Devices are matched by UUID; a device missing from the report is kept but marked
    absent, so the placer never chooses it. A GPU pool takes only its own GPU model: a
    machine with other GPUs is refused with the models named, and nothing is written.
    """
    pool = node.pool
    if node.provision_state == ProvisionState.RETIRED:
        raise InventoryRefused(f"node {node.id} is retired", provisionState="retired")
    if pool.pool_class == PoolClass.METAL_HOST and report.gpus:
        foreign = sorted(report.models() - {pool.gpu_model.upper()})
        if foreign:
            raise InventoryRefused(
                f"pool {pool.id} holds {pool.gpu_model} GPUs; this machine has "
                f"{', '.join(foreign)}", poolModel=pool.gpu_model, found=foreign)
    if report.vcpus < node.vcpus_allocated or report.memory_gib < node.memory_gib_allocated:
        raise InventoryRefused("the machine reports fewer vCPUs or less memory than its "
                               "allocations hold", vcpus=report.vcpus)
    node.hostname = report.hostname or node.hostname
    node.vcpus, node.memory_gib = report.vcpus, report.memory_gib
    node.serial = report.serial or node.serial
    node.product_uuid = report.product_uuid or node.product_uuid
    node.macs = list(report.macs) or node.macs
    node.simulated_root = report.simulated_root
    node.virtualization = report.virtualization
    node.profile = report.profile
    node.inventory_generation += 1
    node.inventory_refused = ""
    if report.topology is not None:  # the agent says where it sits: rack and rail labels
        node.labels = {**{k: v for k, v in node.labels.items() if k not in ("rack", "rail")},
                       **report.topology}
    node.save(update_fields=["hostname", "vcpus", "memory_gib", "serial", "product_uuid",
                             "macs", "simulated_root", "virtualization", "profile",
                             "inventory_generation", "inventory_refused", "labels"])
    seen: set[str] = set()
    for gpu in report.gpus:
        parent = _upsert_device(node, uuid=gpu.uuid, device_class=DeviceClass.GPU,
                                index=gpu.index, product=gpu.product, model=gpu.model,
                                vram_gib=gpu.vram_gib, nvlink_domain=gpu.nvlink_domain,
                                healthy=gpu.healthy, health_reason=gpu.health_reason)
        seen.add(gpu.uuid)
        for mig in gpu.mig:
            _upsert_device(node, uuid=mig.uuid, device_class=DeviceClass.MIG, index=gpu.index,
                           product=gpu.product, model=gpu.model, vram_gib=mig.vram_gib,
                           nvlink_domain="", healthy=gpu.healthy,
                           health_reason=gpu.health_reason, parent=parent,
                           profile=mig.profile)
            seen.add(mig.uuid)
        if not gpu.mig:
            seen.update(_upsert_shares(node, gpu, parent))
    gone = node.devices.filter(present=True).exclude(uuid__in=seen).update(present=False)
    summary = {"gpus": len(report.gpus), "vcpus": report.vcpus,
               "memoryGiB": report.memory_gib, "devicesGone": gone,
               "generation": node.inventory_generation}
    node_event(node, FleetEvent.NODE_INVENTORY_UPDATED, **summary)
    return summary


def _upsert_shares(node: Node, gpu: GpuReport, parent: Device) -> list[str]:
    """The time-sliced shares of a GPU, when its pool's policy slices GPUs; their UUIDs."""
    replicas = node.pool.shares_per_gpu
    uuids = []
    for slot in range(1, replicas + 1):
        uuid = share_uuid(gpu.uuid, slot)
        _upsert_device(node, uuid=uuid, device_class=DeviceClass.SHARE, index=gpu.index,
                       product=gpu.product, model=gpu.model, vram_gib=gpu.vram_gib,
                       nvlink_domain="", healthy=gpu.healthy, health_reason=gpu.health_reason,
                       parent=parent, profile=f"{slot}/{replicas}")
        uuids.append(uuid)
    return uuids


def _upsert_device(node: Node, *, uuid: str, device_class: str, index: int, product: str,
                   model: str, vram_gib: int, nvlink_domain: str, healthy: bool,
                   health_reason: str = "", parent: Device | None = None,
                   profile: str = "") -> Device:
    """Record one reported device. A change of health is an event (`device.unhealthy` with
    its reason, or `device.healthy`); an unhealthy GPU is offered to the ledger's policy."""
    health = Health.HEALTHY if healthy else Health.UNHEALTHY
    values = {"node": node, "device_class": device_class, "index": index, "product": product,
              "model": model, "vram_gib": vram_gib, "nvlink_domain": nvlink_domain,
              "health": health, "health_reason": "" if healthy else health_reason,
              "present": True, "parent": parent, "profile": profile}
    device, created = Device.objects.get_or_create(uuid=uuid, defaults=values)
    before = Health.HEALTHY if created else device.health
    if not created:
        if device.node_id != node.id:
            _take_from_retired(device, node)
        for key, value in values.items():
            setattr(device, key, value)
        device.save(update_fields=list(values))
    if health != before:
        event_emit(tenant_id=node.pool.tenant_id, subject=device.id,
                   type=FleetEvent.DEVICE_HEALTHY if healthy else FleetEvent.DEVICE_UNHEALTHY,
                   payload={"nodeId": node.id, "uuid": uuid, "index": index,
                            "reason": device.health_reason})
        device_health_changed(device.id)
    return device


def _take_from_retired(device: Device, node: Node) -> None:
    """A device another node reported first is this node's only when that node is retired
    (a machine joined twice by mistake, one of them retired); otherwise it is refused."""
    holder = Node.objects.only("hostname", "provision_state").get(pk=device.node_id)
    if holder.provision_state != ProvisionState.RETIRED:
        raise InventoryRefused(
            f"device {device.uuid} belongs to node {holder.id} ({holder.hostname or 'no name'}"
            f"): the same machine joined twice, or a clone; retire the node that should not "
            f"be (nodes retire)", uuid=device.uuid, heldBy=holder.id)


def node_adopt_locked(node: Node, *, checks: list[str]) -> Node:
    """The node passed its pool's acceptance checks: the placer may now consider it."""
    if node.provision_state not in (ProvisionState.ADOPTING, ProvisionState.DEPLOYED,
                                    ProvisionState.ACCEPTANCE_FAILED):
        raise InvalidState(f"node {node.id} is {node.provision_state}, not adopting",
                           provisionState=node.provision_state)
    node.provision_state = ProvisionState.ADOPTED
    node.save(update_fields=["provision_state"])
    if not node.specs.exists():
        node_spec_change_locked(node)
    node_event(node, FleetEvent.NODE_ADOPTED, checks=checks)
    return node


def _set_cordon(*, tenant: Tenant, actor: Principal, node_id: str, cordoned: bool,
                reason: str) -> Node:
    node = access_node_by_id(tenant=tenant, node_id=node_id, lock=True)
    if node.cordoned == cordoned:
        return node
    node.cordoned = cordoned
    node.save(update_fields=["cordoned"])
    verb = "cordon" if cordoned else "uncordon"
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action=f"node.{verb}",
                 target=node.id, reason=reason)
    node_event(node, FleetEvent.NODE_CORDONED if cordoned else FleetEvent.NODE_UNCORDONED,
               reason=reason)
    return node


@audited
def node_cordon(*, tenant: Tenant, actor: Principal, node_id: str, reason: str = "") -> Node:
    """Take a node out of placement; what it holds stays."""
    return _set_cordon(tenant=tenant, actor=actor, node_id=node_id, cordoned=True,
                       reason=reason)


@audited
def node_uncordon(*, tenant: Tenant, actor: Principal, node_id: str, reason: str = "") -> Node:
    """Let the placer use the node again."""
    return _set_cordon(tenant=tenant, actor=actor, node_id=node_id, cordoned=False,
                       reason=reason)


@audited
def node_retire(*, tenant: Tenant, actor: Principal, node_id: str, reason: str) -> Node:
    """Take a node out of the fleet for good: a machine joined by mistake (twice, or a
    clone), or one that is gone. Refused while anything holds it. Its session ends (the
    epoch moves on, so the gateway closes it) and it may not connect again; a device it
    reported may then be reported by another node."""
    node = access_node_by_id(tenant=tenant, node_id=node_id, lock=True)
    if node.provision_state == ProvisionState.RETIRED:
        raise InvalidState(f"node {node.id} is already retired", provisionState="retired")
    refuse_while_held(node, "retired")
    was = node.provision_state
    node.provision_state = ProvisionState.RETIRED
    node.session_epoch += 1
    node.save(update_fields=["provision_state", "session_epoch"])
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="node.retire",
                 target=node.id, reason=reason, data={"was": was})
    node_event(node, FleetEvent.NODE_RETIRED, reason=reason, was=was)
    return node
