"""What the operator console's fleet board shows: each node with its GPUs held and total
(or vCPUs for CPU nodes), the totals, pending reservations, and the ledger's overlap check."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.models import Count, Q

from compute.tenancy.models import Tenant
from fleet.models import DeviceClass, Node
from fleet.selectors import node_list
from reservations.ledger import Reservation, ReservationState


@dataclass(frozen=True)
class Tile:
    node_id: str
    hostname: str
    pool_id: str
    state: str  # adopted, cordoned, unreachable, provisioning, failed
    simulated: bool
    gpus_held: int
    gpus_total: int
    vcpus_held: int
    vcpus_total: int


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
    if node.provision_state == "acceptance-failed":
        return "failed"
    if node.provision_state != "adopted":
        return "provisioning"
    if node.connectivity == "unreachable":
        return "unreachable"
    return "cordoned" if node.cordoned else "adopted"


def ledger_overlaps() -> int:
    """Bookings of one device whose windows overlap: the EXCLUDE constraint keeps it 0."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM reservations_booking a JOIN reservations_booking b "
                       "ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during")
        return int(cursor.fetchone()[0])


def fleet_board(*, tenant: Tenant) -> Board:
    """The board of the tenant's own nodes (three queries, whatever the fleet's size)."""
    nodes = list(node_list(tenant=tenant).annotate(
        gpus_total=Count("devices", filter=Q(devices__present=True,
                                             devices__device_class=DeviceClass.GPU),
                         distinct=True)).order_by("pool_id", "hostname"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT d.node_id, count(*) FROM reservations_booking b JOIN fleet_device d "
                       "ON d.id = b.device_id WHERE b.during @> now() AND d.node_id = ANY(%s) "
                       "GROUP BY d.node_id", [[n.id for n in nodes]])
        held = dict(cursor.fetchall())
    tiles = [Tile(node_id=n.id, hostname=n.hostname or n.id, pool_id=n.pool_id, state=_state(n),
                  simulated=bool(n.simulated_root), gpus_held=held.get(n.id, 0),
                  gpus_total=n.gpus_total, vcpus_held=n.vcpus_allocated, vcpus_total=n.vcpus)
             for n in nodes]
    pending = Reservation.objects.filter(pool__tenant=tenant,
                                         state=ReservationState.PENDING).count()
    return Board(tiles=tiles, gpus_held=sum(t.gpus_held for t in tiles),
                 gpus_total=sum(t.gpus_total for t in tiles),
                 vcpus_held=sum(t.vcpus_held for t in tiles),
                 vcpus_total=sum(t.vcpus_total for t in tiles), pending=pending,
                 overlaps=ledger_overlaps())
