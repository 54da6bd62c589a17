"""What the operator console's fleet board shows: each node with its GPUs held and total
(or vCPUs for CPU nodes), the totals, pending reservations, and the ledger's overlap check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from compute.core.sqltext import tables
from compute.platform.tenancy.models import Tenant
from fleet.models import DeviceClass, Node, NodeRole, ProvisionState
from fleet.models.devices import Device
from fleet.presenters import unschedulable_because
from fleet.selectors import node_list
from reservations.constraints import OVERLAPS_SQL
from reservations.models import Allocation, Booking, Reservation, ReservationState, Sandbox


@dataclass(frozen=True)
class Gpu:
    index: int
    product: str
    nvlink_domain: str
    health: str
    reservation_id: str  # the reservation holding it now, or ""
    maintenance_id: str = ""  # the maintenance window holding it now, or ""


@dataclass(frozen=True)
class Tile:
    node_id: str
    hostname: str
    pool_id: str
    pool_name: str
    state: str  # adopted, cordoned, unreachable, provisioning, failed, refused
    simulated: bool
    gpus_held: int
    gpus_total: int
    vcpus_held: int
    vcpus_total: int
    gpus: tuple[Gpu, ...] = ()
    why: str = ""  # what keeps it from placement, in words ("" when nothing does)


@dataclass(frozen=True)
class Board:
    tiles: list[Tile]
    gpus_held: int
    gpus_total: int
    vcpus_held: int
    vcpus_total: int
    pending: int
    overlaps: int


def _state(node: Node) -> str:
    """The tile's one word: what matters most first (a node that cannot be reached is
    `unreachable` whatever it was doing; one whose inventory is refused is `refused`)."""
    if node.connectivity == "unreachable":
        return "unreachable"
    if node.inventory_refused:
        return "refused"
    if node.provision_state == "acceptance-failed":
        return "failed"
    if node.provision_state != "adopted":
        return "provisioning"
    return "cordoned" if node.cordoned else "adopted"


def ledger_overlaps() -> int:
    """Bookings whose windows overlap on one device, or on a GPU and one of its parts: the
    EXCLUDE constraints keep it 0."""
    with connection.cursor() as cursor:
        cursor.execute(OVERLAPS_SQL)
        return int(cursor.fetchone()[0])


def fleet_board(*, tenant: Tenant) -> Board:
    """The board of the tenant's own machines (four queries, whatever the fleet's size);
    provisioners hold no capacity and are listed with the nodes, not here."""
    nodes = list(node_list(tenant=tenant).filter(role=NodeRole.NODE)
                 .exclude(provision_state=ProvisionState.RETIRED).select_related("pool")
                 .order_by("pool__name", "hostname"))
    gpus = _gpus_now([n.id for n in nodes])
    tiles = [Tile(node_id=n.id, hostname=n.hostname or n.id, pool_id=n.pool_id,
                  pool_name=n.pool.name, state=_state(n), simulated=bool(n.simulated_root),
                  gpus_held=sum(1 for g in gpus.get(n.id, ()) if g.reservation_id),
                  gpus_total=len(gpus.get(n.id, ())), vcpus_held=n.vcpus_allocated,
                  vcpus_total=n.vcpus, gpus=tuple(gpus.get(n.id, ())),
                  why="" if n.schedulable else unschedulable_because(n))
             for n in nodes]
    pending = Reservation.objects.filter(pool__tenant=tenant,
                                         state=ReservationState.PENDING).count()
    return Board(tiles=tiles, gpus_held=sum(t.gpus_held for t in tiles),
                 gpus_total=sum(t.gpus_total for t in tiles),
                 vcpus_held=sum(t.vcpus_held for t in tiles),
                 vcpus_total=sum(t.vcpus_total for t in tiles), pending=pending,
                 overlaps=ledger_overlaps())


def gpus_held_now(node_id: str) -> int:
    """How many of a node's GPUs a booking holds at this moment."""
    return sum(1 for gpu in _gpus_now([node_id]).get(node_id, ()) if gpu.reservation_id)


def _gpus_now(node_ids: list[str]) -> dict[str, list[Gpu]]:
    """Each node's present GPUs, with the reservation whose booking holds each one (or one
    of its parts: a MIG instance, a share) now."""
    with connection.cursor() as cursor:
        cursor.execute(
            tables("SELECT DISTINCT ON (d.node_id, d.index, d.id) d.node_id, d.index, d.product, "
            "       d.nvlink_domain, d.health, coalesce(a.reservation_id, ''), "
            "       coalesce(b.maintenance_id, '') "
            "FROM {Device} d "
            "LEFT JOIN {Booking} b ON b.gpu_id = d.id AND b.during @> now() "
            "LEFT JOIN {Allocation} a ON a.id = b.allocation_id "
            "WHERE d.node_id = ANY(%s) AND d.present AND d.device_class = %s "
            "ORDER BY d.node_id, d.index, d.id, b.whole DESC NULLS LAST",
                Allocation=Allocation, Booking=Booking, Device=Device),
            [node_ids, DeviceClass.GPU])
        by_node: dict[str, list[Gpu]] = {}
        for node_id, *fields in cursor.fetchall():
            by_node.setdefault(node_id, []).append(Gpu(*fields))
    return by_node


def reservations_on_node(node_id: str) -> list[dict[str, Any]]:
    """The reservations that hold the node (booked ahead or running; any tenant's: the
    node's owner sees what holds its machine), soonest first."""
    live = (Allocation.objects.filter(node_id=node_id, ended_at__isnull=True)
            .select_related("reservation__tenant").order_by("reservation__during", "id"))
    return [{"id": a.reservation_id, "tenant": a.reservation.tenant.slug,
             "state": a.reservation.state, "count": a.reservation.count,
             "deviceClass": a.reservation.device_class, "start": a.reservation.starts_at,
             "end": a.reservation.ends_at} for a in live]


def sandboxes_on_node(node_id: str) -> list[dict[str, Any]]:
    """The sandboxes that hold part of a node now (any tenant's: the node's owner sees what
    runs on its machine), oldest first."""
    return [{"id": s.id, "tenant": s.tenant.slug, "state": s.state, "vcpus": s.vcpus,
             "memoryGiB": s.memory_gib, "accelerator": s.accelerator or None,
             "startedAt": s.started_at}
            for s in Sandbox.objects.filter(node_id=node_id, ended_at__isnull=True)
            .select_related("tenant").order_by("created_at", "id")]
