"""What the gateway writes for node sessions: epochs, heartbeats, reports, command results.

Every write is guarded by the session epoch: a stale session (the node has since opened a
newer one) changes nothing, and the gateway closes it. Reports are deduplicated by id.
None of this calls IAM: the node's certificate is its identity.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from bcd.contract.crypto import verify_bytes
from compute.db import database_now, retrying
from fleet.inventory import parse_inventory
from fleet.models import CommandState, Connectivity, Node, NodeCommand, NodeSpec
from fleet.models import ProvisionState as PS
from fleet.services.lifecycle import acceptance_start_locked, command_result_record
from fleet.services.nodes import node_event, node_inventory_ingest

HEARTBEAT_SECONDS = int(os.environ.get("BC_HEARTBEAT_SECONDS", "10"))
LEASE_SECONDS = int(os.environ.get("BC_NODE_LEASE_SECONDS", "40"))


class StaleSession(Exception):
    """A newer session of this node exists: this one may no longer act."""


@dataclass(frozen=True)
class SessionNode:
    node_id: str
    site_id: str
    retired: bool


def node_for_session(node_id: str) -> SessionNode | None:
    row = Node.objects.filter(pk=node_id).values_list("site_id", "provision_state").first()
    if row is None:
        return None
    return SessionNode(node_id, row[0], row[1] == PS.RETIRED)


@retrying
@transaction.atomic(durable=True)
def session_open(*, node_id: str, journal_epoch: int = 0) -> int:
    """Bump the node's session epoch (older sessions lose the right to act) and mark it
    connected; returns the new epoch.

    Commands sent but not answered are delivered again when the agent's journal is the one
    they were sent to (the journal makes the agent run each at most once). When the agent
    comes back with a new journal epoch, its old journal is gone: those commands are marked
    `unknown` and never delivered again.
    """
    node = Node.objects.select_for_update().select_related("pool").get(pk=node_id)
    unanswered = NodeCommand.objects.filter(node=node, state=CommandState.SENT)
    if journal_epoch and node.journal_epoch and journal_epoch != node.journal_epoch:
        lost = unanswered.update(state=CommandState.UNKNOWN, finished_at=timezone.now())
        node_event(node, "node.journal.lost", node.id, "node.journal.lost",
                   oldEpoch=node.journal_epoch, newEpoch=journal_epoch, commandsUnknown=lost)
    else:
        unanswered.update(state=CommandState.QUEUED)
    if journal_epoch:
        node.journal_epoch = journal_epoch
    node.session_epoch += 1
    was = node.connectivity
    node.connectivity = Connectivity.CONNECTED
    node.last_heartbeat_at = database_now()
    node.save(update_fields=["session_epoch", "connectivity", "last_heartbeat_at",
                             "journal_epoch"])
    if was == Connectivity.UNREACHABLE:
        node_event(node, "node.reconnected", node.id, "node.reconnect",
                   epoch=node.session_epoch)
    elif was != Connectivity.CONNECTED:
        node_event(node, "node.connected", node.id, "node.connect", epoch=node.session_epoch)
    return node.session_epoch


@transaction.atomic(durable=True)
def heartbeats_record(beats: dict[str, int]) -> set[str]:
    """Record heartbeats of many nodes in one statement; returns nodes whose epoch is stale.

    A node marked unreachable whose session was only held up (a partition, a frozen
    gateway) is connected again by its next heartbeat: node.reconnected.
    """
    if not beats:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH old AS (SELECT n.id, n.connectivity FROM fleet_node n JOIN "
            "unnest(%s::text[], %s::bigint[]) AS b(id, epoch) ON n.id = b.id AND "
            "n.session_epoch = b.epoch FOR UPDATE OF n) "
            "UPDATE fleet_node n SET last_heartbeat_at = now(), connectivity = 'connected' "
            "FROM old WHERE n.id = old.id RETURNING n.id, old.connectivity",
            [list(beats), list(beats.values())])
        rows = cursor.fetchall()
    back = [node_id for node_id, was in rows if was == Connectivity.UNREACHABLE]
    for node in Node.objects.filter(pk__in=back).select_related("pool"):
        node_event(node, "node.reconnected", node.id, "node.reconnect",
                   epoch=node.session_epoch)
    return set(beats) - {row[0] for row in rows}


def _guard(node_id: str, epoch: int) -> Node:
    node = Node.objects.select_for_update().select_related("pool").get(pk=node_id)
    if node.session_epoch != epoch:
        raise StaleSession(node_id)
    return node


def report_seen(*, report_id: str, node_id: str, kind: str) -> bool:
    """Claim a report id; False when it was received before (a resend)."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO fleet_nodereport (report_id, node_id, kind, received_at) "
                       "VALUES (%s, %s, %s, now()) ON CONFLICT DO NOTHING",
                       [report_id, node_id, kind])
        return cursor.rowcount == 0


@retrying
def inventory_report(*, node_id: str, epoch: int, report_id: str, body: str) -> bool:
    """Ingest an inventory report; the first one of an adopting node starts acceptance.

    Returns False for a duplicate report.
    """
    with transaction.atomic():
        node = _guard(node_id, epoch)
        if report_seen(report_id=report_id, node_id=node_id, kind="inventory"):
            return False
    node_inventory_ingest(node_id=node_id, report=parse_inventory(json.loads(body)))
    with transaction.atomic():
        node = _guard(node_id, epoch)
        if node.provision_state == PS.ADOPTING and not node.acceptance:
            acceptance_start_locked(node, actor_id=node.id)
    return True


@retrying
def command_result(*, node_id: str, epoch: int, report_id: str, command_id: str,
                   status: str, body: str, signature: str) -> bool:
    """Record a command result the node signed with its own key (others are refused)."""
    with transaction.atomic():
        node = _guard(node_id, epoch)
        if not verify_bytes(node.public_key, f"{command_id}\n{status}\n{body}".encode(),
                            signature):
            raise PermissionError(f"result of {command_id} is not signed by {node_id}'s key")
        if report_seen(report_id=report_id, node_id=node_id, kind="command_result"):
            return False
    command_result_record(node_id=node_id, command_id=command_id, status=status,
                          output=json.loads(body or "{}"))
    return True


@transaction.atomic(durable=True)
def commands_to_send(node_epochs: dict[str, int], limit: int = 500) -> list[dict[str, Any]]:
    """Queued commands of these connected nodes, marked sent in the same transaction.

    Reads the (small, indexed) queue first and keeps the commands of nodes in session here,
    so the cost does not grow with the number of idle sessions.
    """
    queued = NodeCommand.objects.filter(state=CommandState.QUEUED).values_list("id",
                                                                                "node_id")
    wanted = [command_id for command_id, node_id in queued[: limit * 4]
              if node_id in node_epochs]
    if not wanted:
        return []
    rows = list(NodeCommand.objects.select_for_update(skip_locked=True)
                .filter(pk__in=wanted, state=CommandState.QUEUED)
                .order_by("created_at")[:limit])
    now = timezone.now()
    for command in rows:
        command.state, command.sent_at = CommandState.SENT, now
        command.save(update_fields=["state", "sent_at"])
    return [{"nodeId": c.node_id, "commandId": c.id, "kind": c.kind,
             "json": json.dumps(c.payload)} for c in rows]


@retrying
@transaction.atomic(durable=True)
def nodes_mark_unreachable(*, lease: timedelta = timedelta(seconds=LEASE_SECONDS)) -> list[str]:
    """Connected nodes silent for longer than the lease become unreachable (and so
    unschedulable). Nothing they hold is released."""
    cutoff = database_now() - lease
    quiet = list(Node.objects.select_for_update(skip_locked=True).select_related("pool")
                 .filter(connectivity=Connectivity.CONNECTED, last_heartbeat_at__lt=cutoff))
    for node in quiet:
        node.connectivity = Connectivity.UNREACHABLE
        node.save(update_fields=["connectivity"])
        node_event(node, "node.unreachable", "system", "node.unreachable",
                   lastHeartbeatAt=node.last_heartbeat_at)
    return [node.id for node in quiet]


def latest_spec(*, node_id: str) -> dict[str, Any] | None:
    spec = NodeSpec.objects.filter(node_id=node_id).order_by("-generation").first()
    return None if spec is None else {"generation": spec.generation,
                                      "json": json.dumps(spec.spec)}


def specs_since(*, spec_id: int) -> tuple[list[dict[str, Any]], int]:
    """NodeSpec rows written after `spec_id` (rows only grow), and the new high mark."""
    rows = list(NodeSpec.objects.filter(pk__gt=spec_id).order_by("pk")
                .values_list("pk", "node_id", "generation", "spec")[:1000])
    if not rows:
        if spec_id == 0:  # start from now: sessions get their latest spec on Hello
            newest = NodeSpec.objects.order_by("-pk").values_list("pk", flat=True).first()
            return [], newest or 0
        return [], spec_id
    return ([{"nodeId": node_id, "generation": generation, "json": json.dumps(spec)}
             for _, node_id, generation, spec in rows], rows[-1][0])
