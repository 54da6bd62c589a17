"""What of the ledger holds a node: live allocations (reservations that have started or are
booked ahead) and sandboxes that have not ended."""

from __future__ import annotations

from fleet.holders import node_holder
from fleet.models import Node
from reservations.models import Allocation, Sandbox


@node_holder
def ledger_holds(node: Node) -> list[str]:
    reservations = Allocation.objects.filter(node=node, ended_at__isnull=True).values_list(
        "reservation_id", flat=True)
    sandboxes = Sandbox.objects.filter(node=node, ended_at__isnull=True).values_list(
        "id", flat=True)
    return ([f"reservation {r}" for r in reservations.order_by("reservation_id")] +
            [f"sandbox {s}" for s in sandboxes.order_by("id")])
