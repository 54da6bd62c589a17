"""What the gateway writes for node sessions: epochs, heartbeats, reports, command results.

Every write is guarded by the session epoch: a stale session (the node has since opened a
newer one) changes nothing, and the gateway closes it. Each report is one service: the
epoch guard, the claim of its report id (a resend is answered `duplicate`) and the domain
write commit together or not at all, and a retry repeats all three. None of this calls
IAM: the node's certificate is its identity.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from audit.services import audit_denied, audit_exempt, audit_record, audited
from bcd.contract.crypto import verify_bytes
from bcd.contract.reports import REPORT_KINDS, statement
from compute.core.db import database_now
from compute.core.sqltext import tables
from fleet.events import FleetEvent
from fleet.inventory import parse_inventory
from fleet.models import CommandState, Connectivity, Node, NodeCommand, NodeSpec, ReportInbox
from fleet.models import ProvisionState as PS
from fleet.models.agent import NodeReport
from fleet.services.lifecycle import acceptance_start_locked, command_result_locked
from fleet.services.nodes import node_event, node_inventory_ingest_locked
from fleet.services.specs import spec_rebase_locked
from fleet.work import command_outcome_lost, node_reports_filed


class StaleSession(Exception):
    """A newer session of this node exists: this one may no longer act."""


def node_report_refused(*, node_id: str, action: str, reason: str) -> None:
    """The one denied audit row of a node report that was refused (its change rolled back)."""
    tenant_id = Node.objects.filter(pk=node_id).values_list("pool__tenant_id", flat=True).get()
    audit_denied(tenant_id=tenant_id, actor_id=node_id, action=action, target=node_id,
                 reason=reason)


def _audit(node: Node, action: str, **data: Any) -> None:
    audit_record(tenant_id=node.pool.tenant_id, actor_id=node.id, action=action,
                 target=node.id, data=data)


# The node columns the gateway reads and writes (its role may read no others).
SESSION_COLUMNS = ("id", "session_epoch", "connectivity", "last_heartbeat_at", "connected_at",
                   "journal_epoch", "agent_version", "agent_refused", "gateway")
SESSION_CHANGE = "session"  # the inbox kind of what the gateway itself says of a session


@transaction.atomic(durable=True)
def session_open(*, node_id: str, journal_epoch: int = 0, agent_version: str | None = None,
                 gateway: str = "", journal_generation: int = 0) -> int:
    """Bump the node's session epoch (older sessions lose the right to act) and mark it
    connected; returns the new epoch. Session bookkeeping, run by the gateway: what it
    means (events, the audit row) is filed in the node's inbox for a worker to record
    (`session_change_record`), as the gateway's role writes no history.

    Commands sent but not answered are delivered again when the agent's journal is the one
    they were sent to (the journal makes the agent run each at most once). When the agent
    comes back with a new journal epoch, its old journal is gone: every command sent before
    and not answered is marked `unknown` and never delivered again, including one queued
    again for a session that never took it (it may have run under the lost journal).

    `agent_version` is what the agent's Hello said, once `agent_refusal` took it (None:
    not told, as in tests that open sessions directly); `gateway` names the gateway that
    holds the session.

    `journal_generation` is the newest spec generation the node's journal applied. Above
    the ledger's newest, the ledger went back in time (restored to an earlier point): the
    worker that records the change writes the ledger's spec above it (`spec_rebase_locked`),
    so that the node converges to the ledger again instead of ignoring its older specs.
    """
    node = Node.objects.select_for_update(no_key=True).only(*SESSION_COLUMNS).get(pk=node_id)
    unanswered = NodeCommand.objects.filter(node_id=node_id, state=CommandState.SENT)
    change: dict[str, Any] = {"change": "open", "was": node.connectivity}
    if journal_epoch and node.journal_epoch and journal_epoch != node.journal_epoch:
        unanswered = NodeCommand.objects.filter(
            Q(state=CommandState.SENT) | Q(state=CommandState.QUEUED, sent_at__isnull=False),
            node_id=node_id)
        provisioning = list(unanswered.filter(kind__startswith="bmc.").values_list(
            "id", flat=True))
        lost = unanswered.update(state=CommandState.UNKNOWN, finished_at=timezone.now())
        for command_id in provisioning:  # the machine's step ends: whether it ran is unknown
            command_outcome_lost(command_id)
        change.update(oldJournalEpoch=node.journal_epoch, commandsUnknown=lost)
    else:
        unanswered.update(state=CommandState.QUEUED)
    if journal_epoch:
        node.journal_epoch = journal_epoch
    ledger_generation = NodeSpec.objects.filter(node_id=node_id).aggregate(
        newest=Max("generation"))["newest"] or 0
    if journal_generation > ledger_generation:
        change.update(journalGeneration=journal_generation, ledgerGeneration=ledger_generation)
    if agent_version is not None:
        node.agent_version, node.agent_refused = agent_version[:64], ""
        change["agentVersion"] = node.agent_version
    node.session_epoch += 1
    node.gateway = gateway[:100]
    node.connectivity = Connectivity.CONNECTED
    node.last_heartbeat_at = database_now()
    if change["was"] != Connectivity.CONNECTED:
        node.connected_at = node.last_heartbeat_at
    node.save(update_fields=["session_epoch", "connectivity", "last_heartbeat_at",
                             "connected_at", "journal_epoch", "agent_version", "agent_refused",
                             "gateway"])
    _file_change(node_id, node.session_epoch, journalEpoch=node.journal_epoch,
                 gateway=node.gateway, **change)
    return node.session_epoch


@transaction.atomic(durable=True)
def session_refuse(*, node_id: str, agent_version: str, reason: str) -> None:
    """The agent's version is one this control plane does not take (`agent_refusal`): no
    session opens, and the node shows why. Filed for a worker to record once per refusal
    (an agent retrying with the same version files nothing more)."""
    node = Node.objects.select_for_update(no_key=True).only(*SESSION_COLUMNS).get(pk=node_id)
    agent_version, reason = agent_version[:64], reason[:300]
    if (node.agent_version, node.agent_refused) == (agent_version, reason):
        return
    node.agent_version, node.agent_refused = agent_version, reason
    node.save(update_fields=["agent_version", "agent_refused"])
    _file_change(node_id, node.session_epoch, change="refused", was=node.connectivity,
                 agentVersion=agent_version, reason=reason)


def session_changes_pending(node_id: str) -> bool:
    """Whether the gateway filed session changes of the node that a worker has not recorded."""
    return ReportInbox.objects.filter(node_id=node_id, kind=SESSION_CHANGE).exists()


def _file_change(node_id: str, epoch: int, **change: Any) -> None:
    ReportInbox.objects.create(node_id=node_id, epoch=epoch, kind=SESSION_CHANGE, fields=change)
    node_reports_filed(node_id)


@audited
def session_change_record(*, node_id: str, epoch: int, change: dict[str, Any]) -> None:
    """Record what the gateway filed of a node's session: the events it stands for and its
    audit row (the gateway's, not the node's word: its actor is `gateway`)."""
    node = Node.objects.select_related("pool").get(pk=node_id)
    kind, was = change.get("change"), change.get("was")
    if kind not in ("open", "reconnect", "refused") or was not in Connectivity.values:
        raise ValueError(f"no such session change: {str(kind)[:32]!r} from {str(was)[:32]!r}")
    if kind == "refused":
        _refusal_record(node, change)
        return
    if not 0 < epoch <= node.session_epoch:
        raise ValueError(f"session epoch {epoch} was never opened")
    numbers = {name: change.get(name, 0) for name in ("journalEpoch", "oldJournalEpoch",
                                                       "commandsUnknown")}
    if not all(isinstance(value, int) and value >= 0 for value in numbers.values()):
        raise ValueError("journalEpoch, oldJournalEpoch and commandsUnknown are counts")
    if numbers["oldJournalEpoch"]:
        node_event(node, FleetEvent.NODE_JOURNAL_LOST, oldEpoch=numbers["oldJournalEpoch"],
                   newEpoch=numbers["journalEpoch"], commandsUnknown=numbers["commandsUnknown"])
    if was == Connectivity.UNREACHABLE:
        node_event(node, FleetEvent.NODE_RECONNECTED, epoch=epoch)
    elif was != Connectivity.CONNECTED:
        node_event(node, FleetEvent.NODE_CONNECTED, epoch=epoch)
    action, data = (("node.reconnect", {"epoch": epoch}) if kind == "reconnect" else
                    ("node.session.open", {"epoch": epoch, "was": was,
                                           "journalEpoch": numbers["journalEpoch"],
                                           "commandsUnknown": numbers["commandsUnknown"],
                                           "agentVersion": str(change.get("agentVersion",
                                                                          ""))[:64],
                                           "gateway": str(change.get("gateway", ""))[:100]}))
    if kind == "open" and "journalGeneration" in change:
        data = {**data, "specRebased": _rebase(node, change)}
    audit_record(tenant_id=node.pool.tenant_id, actor_id="gateway", action=action,
                 target=node.id, data=data)


MAX_GENERATION = 2**53  # a claim above this is malformed (and would exhaust the counter)


def _generation(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_GENERATION:
        raise ValueError("journalGeneration and ledgerGeneration are generations")
    return value


def _rebase(node: Node, change: dict[str, Any]) -> dict[str, int]:
    """The node applied a generation the ledger never wrote (or lost): write the ledger's
    spec as the generation after the node's, with `node.spec.rebased`."""
    journal, ledger = (_generation(change.get(name))
                       for name in ("journalGeneration", "ledgerGeneration"))
    locked = Node.objects.select_for_update(no_key=True).select_related("pool").get(pk=node.pk)
    spec, written = spec_rebase_locked(locked, above=journal)
    rebased = {"journalGeneration": journal, "ledgerGeneration": ledger,
               "generation": spec.generation}
    if written:  # a repeat of the change writes nothing new
        node_event(node, FleetEvent.NODE_SPEC_REBASED, **rebased)
    return rebased


def _refusal_record(node: Node, change: dict[str, Any]) -> None:
    agent_version, reason = (str(change.get(key, ""))[:300] for key in ("agentVersion",
                                                                          "reason"))
    node_event(node, FleetEvent.NODE_AGENT_REFUSED, agentVersion=agent_version, reason=reason)
    audit_record(tenant_id=node.pool.tenant_id, actor_id="gateway",
                 action="node.session.refuse", target=node.id,
                 data={"agentVersion": agent_version, "reason": reason})


@transaction.atomic(durable=True)
def heartbeats_record(beats: dict[str, int]) -> tuple[set[str], set[str]]:
    """Record heartbeats of many nodes in one statement (liveness bookkeeping, not audited).

    Returns (stale, unreachable): nodes whose epoch is stale, and nodes of a current
    session that were marked unreachable (their session was only held up: a partition, a
    frozen gateway), which `node_reconnect` brings back one by one.
    """
    if not beats:
        return set(), set()
    with connection.cursor() as cursor:
        cursor.execute(
            tables("WITH old AS (SELECT n.id, n.connectivity FROM {Node} n JOIN "
            "unnest(%s::text[], %s::bigint[]) AS b(id, epoch) ON n.id = b.id AND "
            "n.session_epoch = b.epoch FOR NO KEY UPDATE OF n) "
            "UPDATE {Node} n SET last_heartbeat_at = now() "
            "FROM old WHERE n.id = old.id RETURNING n.id, old.connectivity", Node=Node),
            [list(beats), list(beats.values())])
        rows = cursor.fetchall()
    back = {node_id for node_id, was in rows if was == Connectivity.UNREACHABLE}
    return set(beats) - {row[0] for row in rows}, back


@transaction.atomic(durable=True)
def node_reconnect(*, node_id: str, epoch: int) -> bool:
    """A heartbeat of the node's current session after it was marked unreachable: connected
    again (session bookkeeping by the gateway, recorded by a worker as `session_open`'s is).
    False when it was not unreachable."""
    node = Node.objects.select_for_update(no_key=True).only(*SESSION_COLUMNS).get(pk=node_id)
    if node.session_epoch != epoch:
        raise StaleSession(node_id)
    if node.connectivity != Connectivity.UNREACHABLE:
        return False
    node.connectivity = Connectivity.CONNECTED
    node.connected_at = database_now()
    node.save(update_fields=["connectivity", "connected_at"])
    _file_change(node_id, epoch, change="reconnect", was=Connectivity.UNREACHABLE)
    return True


def _guard(node_id: str, epoch: int) -> Node:
    node = (Node.objects.select_for_update(no_key=True, of=("self",)).select_related("pool")
            .get(pk=node_id))
    if node.session_epoch != epoch:
        raise StaleSession(node_id)
    return node


def report_claim(*, report_id: str, node_id: str, kind: str, epoch: int) -> bool:
    """Claim a report id in the caller's transaction; False when it was received before.

    A claim is kept while its session is the node's current one: a report of an older
    session is refused by its epoch, so replaying it needs no claim (`claims_prune`).
    """
    with connection.cursor() as cursor:
        cursor.execute(tables("INSERT INTO {NodeReport} (report_id, node_id, kind, epoch, "
                       "received_at) VALUES (%s, %s, %s, %s, now()) ON CONFLICT DO NOTHING",
                           NodeReport=NodeReport),
                       [report_id, node_id, kind, epoch])
        return cursor.rowcount == 1


def claims_prune() -> int:
    """Drop the report claims of sessions older than their node's current one."""
    with connection.cursor() as cursor:
        cursor.execute(tables("DELETE FROM {NodeReport} r USING {Node} n "
                       "WHERE r.node_id = n.id AND r.epoch < n.session_epoch",
                           Node=Node, NodeReport=NodeReport))
        return cursor.rowcount


def report_proven(report: ReportInbox, public_key: str) -> bool:
    """Did the node sign this filed report (its kind, id, epoch and body) with its key?"""
    fields = report.fields if isinstance(report.fields, dict) else {}
    command = ({"command_id": str(fields.get("commandId", "")),
                "status": str(fields.get("status", ""))}
               if report.kind == "command_result" else {})
    signed = statement(kind=report.kind, report_id=str(fields.get("reportId", "")),
                       epoch=report.epoch, body=str(fields.get("body", "")), **command)
    return bool(public_key) and verify_bytes(public_key, signed,
                                             str(fields.get("reportSignature", "")))


@audited
def inventory_report_record(*, node_id: str, epoch: int, report_id: str, body: str) -> bool:
    """Ingest an inventory report; the first one of an adopting node (or of a deployed
    machine's new OS) starts acceptance.

    Returns False for a duplicate report (nothing written).
    """
    report = parse_inventory(json.loads(body))
    node = _guard(node_id, epoch)
    if not report_claim(report_id=report_id, node_id=node_id, kind="inventory", epoch=epoch):
        return False
    summary: dict[str, Any] = node_inventory_ingest_locked(node, report)
    if node.provision_state in (PS.ADOPTING, PS.DEPLOYED) and not node.acceptance:
        acceptance_start_locked(node)
        summary["acceptanceAttempt"] = node.acceptance["attempt"]
    _audit(node, "node.inventory", reportId=report_id, **summary)
    return True


@audited
def inventory_refused_record(*, node_id: str, reason: str) -> None:
    """A refused inventory report (nothing of it was written): its denied audit row, and the
    reason kept on the node, where its conditions show it until a report is taken; the
    event `node.inventory.refused` when the reason is new."""
    node = Node.objects.select_for_update(no_key=True).select_related("pool").get(pk=node_id)
    audit_record(tenant_id=node.pool.tenant_id, actor_id=node_id, action="node.inventory",
                 target=node_id, allowed=False, reason=reason)
    if node.inventory_refused != reason[:300]:
        node.inventory_refused = reason[:300]
        node.save(update_fields=["inventory_refused"])
        node_event(node, FleetEvent.NODE_INVENTORY_REFUSED, reason=reason)


@audited
def command_result_record(*, node_id: str, epoch: int, report_id: str, command_id: str,
                          status: str, body: str, signature: str) -> bool:
    """Record a command result the node signed with its own key (others are refused).

    Returns False for a duplicate report; a result for a finished or unknown command is
    claimed but changes nothing.
    """
    node = _guard(node_id, epoch)
    if not verify_bytes(node.public_key, f"{command_id}\n{status}\n{body}".encode(),
                        signature):
        raise PermissionError(f"result of {command_id} is not signed by {node_id}'s key")
    if not report_claim(report_id=report_id, node_id=node_id, kind="command_result",
                        epoch=epoch):
        return False
    summary = command_result_locked(node, command_id=command_id, status=status,
                                    output=json.loads(body or "{}"))
    if summary is not None:
        _audit(node, "node.command.result", reportId=report_id, **summary)
    else:
        audit_exempt("a result for a finished or unknown command: only its report is claimed")
    return True


@transaction.atomic(durable=True)
def commands_to_send(node_epochs: dict[str, int], limit: int = 500) -> list[dict[str, Any]]:
    """Queued commands of these connected nodes, marked sent in the same transaction
    (delivery bookkeeping: the command's creation and its result are what is audited).

    Reads the (small, indexed) queue first and keeps the commands of nodes in session here,
    so the cost does not grow with the number of idle sessions.
    """
    queued = NodeCommand.objects.filter(state=CommandState.QUEUED).values_list("id",
                                                                                "node_id")
    wanted = [command_id for command_id, node_id in queued[: limit * 4]
              if node_id in node_epochs]
    if not wanted:
        return []
    rows = list(NodeCommand.objects.select_for_update(no_key=True, skip_locked=True)
                .only("id", "node_id", "kind", "signed", "state", "sent_at", "created_at")
                .filter(pk__in=wanted, state=CommandState.QUEUED)
                .order_by("created_at")[:limit])
    now = timezone.now()
    for command in rows:
        command.state, command.sent_at = CommandState.SENT, now
        command.save(update_fields=["state", "sent_at"])
    return [{"nodeId": c.node_id, "commandId": c.id, "kind": c.kind, "json": c.signed}
            for c in rows]


def lease() -> timedelta:
    return timedelta(seconds=settings.BC_NODE_LEASE_SECONDS)


@audited
def node_mark_unreachable(*, node_id: str) -> Node | None:
    """A connected node silent for longer than the lease becomes unreachable (and so
    unschedulable). Nothing it holds is released. None when it is not (or no longer) due,
    or while what the gateway filed of its sessions is still to be recorded: the node's
    events keep the order things happened in (the next sweep finds it due again)."""
    cutoff = database_now() - lease()
    node = (Node.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
            .select_related("pool")
            .filter(pk=node_id, connectivity=Connectivity.CONNECTED,
                    last_heartbeat_at__lt=cutoff).first())
    if node is None or session_changes_pending(node_id):
        return None
    node.connectivity = Connectivity.UNREACHABLE
    node.save(update_fields=["connectivity"])
    node_event(node, FleetEvent.NODE_UNREACHABLE, lastHeartbeatAt=node.last_heartbeat_at)
    audit_record(tenant_id=node.pool.tenant_id, actor_id="system", action="node.unreachable",
                 target=node.id, data={"lastHeartbeatAt": node.last_heartbeat_at},
                 reason="no heartbeat within the lease")
    return node


@transaction.atomic(durable=True)
def reports_file(*, node_id: str, epoch: int, reports: list[tuple[str, dict[str, Any]]]
                 ) -> None:
    """File reports the gateway received over a session, for a worker to verify and apply
    (delivery bookkeeping: each is audited when applied or refused)."""
    unknown = sorted({kind for kind, _ in reports} - set(REPORT_KINDS))
    if unknown:
        raise ValueError(f"no such report: {', '.join(unknown)}")
    ReportInbox.objects.bulk_create([ReportInbox(node_id=node_id, epoch=epoch, kind=kind,
                                                 fields=fields) for kind, fields in reports])
    node_reports_filed(node_id)
