"""The fleet's level-triggered reconcilers on the work queue.

`sweep()` turns timers into work items: connected nodes silent past their lease, deploys
past their deadline, enrolled machines whose BMC is due a poll. Each handler re-reads the
node and takes one step, so a repeat is harmless.
"""

from __future__ import annotations

from compute.core.db import database_now
from compute.platform.queue.work import enqueue, handler
from fleet.models import Connectivity, Node
from fleet.services.deploy import bmc_poll, deploy_time_out, machines_due
from fleet.services.lifecycle import command_outcome_unknown
from fleet.services.sessions import lease, node_mark_unreachable
from fleet.work import COMMAND

NODE = "node"
DEPLOY = "deploy"
BMC_POLL = "bmc-poll"


@handler(NODE)
def reconcile_node(node_id: str) -> None:
    """Liveness: a node silent past its lease turns unreachable; it never loses its holds."""
    node_mark_unreachable(node_id=node_id)


@handler(COMMAND)
def reconcile_command(command_id: str) -> None:
    """A command lost with its node's journal: settle what it was doing, once."""
    command_outcome_unknown(command_id=command_id)


@handler(DEPLOY)
def reconcile_deploy(node_id: str) -> None:
    """A deploy past its deadline fails and powers the machine off."""
    deploy_time_out(node_id=node_id)


@handler(BMC_POLL)
def reconcile_bmc(node_id: str) -> None:
    """Ask a machine's BMC whether it answers (I5: that only ever marks the node)."""
    bmc_poll(node_id=node_id)


def sweep(limit: int = 500) -> int:
    """Enqueue the nodes whose lease ran out, the late deploys and the BMCs due a poll;
    cheap enough to run every half second."""
    cutoff = database_now() - lease()
    quiet = list(Node.objects.filter(connectivity=Connectivity.CONNECTED,
                                     last_heartbeat_at__lt=cutoff)
                 .values_list("id", flat=True)[:limit])
    late, polls = machines_due(limit)
    for kind, ids in ((NODE, quiet), (DEPLOY, late), (BMC_POLL, polls)):
        for node_id in ids:
            enqueue(kind, node_id)
    return len(quiet) + len(late) + len(polls)
