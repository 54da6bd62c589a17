"""Reports from nodes, verified and applied by the control plane (not by the gateway).

The gateway files each report a node sends into the node's inbox (ReportInbox) and
acknowledges it, along with what it says itself of the node's sessions; this worker step
takes them in the order they came, checks each report against the node's own key (its
signature over the report's kind, id, session epoch and body) and its current session, and
applies it with the service that owns it. A report that proves nothing is refused and
audited, and changes nothing. A report is dropped from the inbox only once applied or
refused, so a worker that dies in between applies it again, which every report allows
(each is a no-op the second time).

Each app declares the kinds it applies in its own `reports.py` (`report_kind`), collected
when the fleet app starts; the fleet's are below.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compute.core.errors import ComputeError
from compute.core.metrics import REPORT_DUPLICATES, TELEMETRY_SUPERSEDED
from compute.platform.queue.work import handler
from fleet.models import Node, ReportInbox
from fleet.services import sessions, telemetry
from fleet.work import REPORTS

logger = logging.getLogger("fleet.reports")
BATCH = 100
TELEMETRY = "telemetry"


class ReportRefused(Exception):
    """A report that does not prove what it claims; the reason goes to the audit trail."""


class StaleReport(Exception):
    """A report the node signed, true when it was made and outdated since. Dropped; nothing
    is refused, so nothing is audited."""


@dataclass(frozen=True)
class ReportKind:
    apply: Callable[..., Any]
    refusal_action: str  # the audit action of a refusal; "" where the service audits its
    # refusals itself, or where a malformed report is dropped unaudited (telemetry)
    takes: tuple[str, ...]  # what `apply` is given besides node_id and body
    deduplicated: bool  # `apply` answers whether the report was new
    refused: Callable[..., None] | None = None  # records a refusal (node_id, reason) in
    # place of the plain denied row, where the node itself shows it


KINDS: dict[str, ReportKind] = {}


def report_kind(kind: str, apply: Callable[..., Any], *, refusal_action: str = "",
                takes: tuple[str, ...] = ("signature",), deduplicated: bool = False,
                refused: Callable[..., None] | None = None) -> None:
    """Declare who applies reports of `kind`, and with which of the filed fields (epoch,
    report_id, command_id, status, signature)."""
    KINDS[kind] = ReportKind(apply, refusal_action, takes, deduplicated, refused)


report_kind("inventory", sessions.inventory_report_record, refusal_action="node.inventory",
            takes=("epoch", "report_id"), deduplicated=True,
            refused=sessions.inventory_refused_record)
report_kind(TELEMETRY, telemetry.telemetry_record, takes=("epoch", "report_id"),
            deduplicated=True)
report_kind("command_result", sessions.command_result_record,
            refusal_action="node.command.result",
            takes=("epoch", "report_id", "command_id", "status", "signature"),
            deduplicated=True)


@handler(REPORTS)
def reconcile_reports(node_id: str) -> None:
    """Apply the node's filed reports, oldest first. GPU readings with a newer reading of the
    node behind them are verified but not applied: a reading stands for its moment, and a
    backlog of them (a fleet's readings outrunning the workers) would only delay the node's
    other reports and repeat work the newest one does."""
    public_key = Node.objects.filter(pk=node_id).values_list("public_key", flat=True).first()
    while batch := list(ReportInbox.objects.filter(node_id=node_id).order_by("id")[:BATCH]):
        newest = max((r.pk for r in batch if r.kind == TELEMETRY), default=None)
        for report in batch:
            if report.kind != TELEMETRY or report.pk == newest:
                apply_report(report, public_key or "")
            elif proven(report, public_key or ""):  # a forgery is refused all the same
                TELEMETRY_SUPERSEDED.inc()
            ReportInbox.objects.filter(pk=report.pk).delete()


def proven(report: ReportInbox, public_key: str) -> bool:
    """Is the report of a known kind and signed by the node's key? If not, it is refused
    (and audited)."""
    if report.kind in KINDS and sessions.report_proven(report, public_key):
        return True
    filed = report.fields if isinstance(report.fields, dict) else {}
    reason = (f"{report.kind[:32]} report {str(filed.get('reportId', ''))[:64]!r} is "
              f"not signed by {report.node_id}'s key")
    logger.warning("node %s: %s", report.node_id, reason)
    sessions.node_report_refused(node_id=report.node_id, action="node.report", reason=reason)
    return False


def apply_report(report: ReportInbox, public_key: str) -> None:
    """One report, applied by the service that owns it once it is shown to be the node's
    own (signed by its key over its kind, id, epoch and body), or refused (and audited)."""
    filed = report.fields if isinstance(report.fields, dict) else {}
    if report.kind == sessions.SESSION_CHANGE:  # the gateway's own word, recorded as such
        try:
            sessions.session_change_record(node_id=report.node_id, epoch=report.epoch,
                                           change=filed)
        except ValueError as refusal:
            logger.warning("node %s: session change refused: %s", report.node_id, refusal)
            sessions.node_report_refused(node_id=report.node_id, action="node.session",
                                         reason=str(refusal))
        return
    if not proven(report, public_key):
        return
    kind = KINDS[report.kind]
    given = {"epoch": report.epoch, "report_id": str(filed.get("reportId", "")),
             "command_id": str(filed.get("commandId", "")),
             "status": str(filed.get("status", "")),
             "signature": str(filed.get("signature", ""))}
    try:
        outcome = kind.apply(node_id=report.node_id, body=str(filed.get("body", "")),
                             **{name: given[name] for name in kind.takes})
    except sessions.StaleSession:
        logger.info("node %s: %s of an older session dropped", report.node_id, report.kind)
    except StaleReport as outdated:
        logger.info("node %s: %s dropped: %s", report.node_id, report.kind, outdated)
    except (ReportRefused, ComputeError, PermissionError, ValueError) as refusal:
        reason = refusal.message if isinstance(refusal, ComputeError) else str(refusal)
        logger.warning("node %s: %s refused: %s", report.node_id, report.kind, reason)
        if kind.refused is not None:
            kind.refused(node_id=report.node_id, reason=reason)
        elif kind.refusal_action:
            sessions.node_report_refused(node_id=report.node_id, action=kind.refusal_action,
                                         reason=reason)
    else:
        if kind.deduplicated:
            REPORT_DUPLICATES.inc(0 if outcome else 1)
