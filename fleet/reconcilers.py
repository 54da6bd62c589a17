"""The fleet's level-triggered reconcilers on the work queue.

`sweep()` turns the liveness timer into work items: connected nodes silent past their
lease. The handler re-reads the node and takes one step, so a repeat is harmless.
"""

from __future__ import annotations

from compute.db import database_now
from compute.queue.work import enqueue, handler
from fleet.models import Connectivity, Node
from fleet.services.lifecycle import command_outcome_unknown
from fleet.services.sessions import lease, node_mark_unreachable
from fleet.work import COMMAND

NODE = "node"


@handler(NODE)
def reconcile_node(node_id: str) -> None:
    """Liveness: a node silent past its lease turns unreachable; it never loses its holds."""
    node_mark_unreachable(node_id=node_id)


@handler(COMMAND)
def reconcile_command(command_id: str) -> None:
    """A command lost with its node's journal: settle what it was doing, once."""
    command_outcome_unknown(command_id=command_id)


def sweep(limit: int = 500) -> int:
    """Enqueue the nodes whose lease ran out; cheap enough to run every half second."""
    cutoff = database_now() - lease()
    quiet = list(Node.objects.filter(connectivity=Connectivity.CONNECTED,
                                     last_heartbeat_at__lt=cutoff)
                 .values_list("id", flat=True)[:limit])
    for node_id in quiet:
        enqueue(NODE, node_id)
    return len(quiet)
