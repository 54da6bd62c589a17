"""Reports from nodes, verified and applied by the control plane (not by the gateway).

The gateway files each report a node sends into the node's inbox (fleet.ReportInbox) and
acknowledges it, along with what it says itself of the node's sessions; this worker step
takes them in the order they came, checks each report against the node's own key (its
signature over the report's kind, id, session epoch and body) and its current session, and
applies it with the service that owns it. A report that proves nothing is refused and
audited, and changes nothing. A report is dropped from the inbox only once applied or
refused, so a worker that dies in between applies it again, which every report allows
(each is a no-op the second time).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from compute.core.errors import ComputeError
from compute.core.metrics import REPORT_DUPLICATES
from compute.platform.queue.work import handler
from fleet.models import Node, ReportInbox
from fleet.services import sessions, telemetry
from fleet.work import REPORTS
from reservations.services import binding, sandbox_reports

logger = logging.getLogger("reservations.reports")
BATCH = 100

# kind -> (how to apply it, the audit action of its refusal; "" where the service audits
# its refusals itself, or where a malformed report is dropped unaudited: telemetry)
APPLY: dict[str, tuple[Callable[..., Any], str]] = {
    "inventory": (sessions.inventory_report_record, "node.inventory"),
    "telemetry": (telemetry.telemetry_record, ""),
    "command_result": (sessions.command_result_record, "node.command.result"),
    "bound": (binding.allocation_bound_record, ""),
    "released": (binding.allocation_released_record, "allocation.release"),
    "failed": (binding.allocation_failed_record, "reservation.bind"),
    "vm": (sandbox_reports.vm_report_record, ""),
}
WITH_EPOCH = ("inventory", "telemetry", "command_result")
DEDUPLICATED = ("inventory", "telemetry", "command_result")  # they answer: was it new?


@handler(REPORTS)
def reconcile_reports(node_id: str) -> None:
    """Apply the node's filed reports, oldest first."""
    public_key = Node.objects.filter(pk=node_id).values_list("public_key", flat=True).first()
    while batch := list(ReportInbox.objects.filter(node_id=node_id).order_by("id")[:BATCH]):
        for report in batch:
            apply_report(report, public_key or "")
            ReportInbox.objects.filter(pk=report.pk).delete()


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
    if report.kind not in APPLY or not sessions.report_proven(report, public_key):
        reason = (f"{report.kind[:32]} report {str(filed.get('reportId', ''))[:64]!r} is "
                  f"not signed by {report.node_id}'s key")
        logger.warning("node %s: %s", report.node_id, reason)
        sessions.node_report_refused(node_id=report.node_id, action="node.report",
                                     reason=reason)
        return
    apply, refusal_action = APPLY[report.kind]
    fields = {"node_id": report.node_id, "body": str(filed.get("body", "")),
              **({"epoch": report.epoch} if report.kind in WITH_EPOCH else {})}
    if report.kind in ("inventory", "telemetry", "command_result"):
        fields["report_id"] = str(filed.get("reportId", ""))
    if report.kind == "command_result":
        fields.update(command_id=str(filed.get("commandId", "")),
                      status=str(filed.get("status", "")))
    if report.kind not in ("inventory", "telemetry"):
        fields["signature"] = str(filed.get("signature", ""))
    try:
        outcome = apply(**fields)
    except sessions.StaleSession:
        logger.info("node %s: %s of an older session dropped", report.node_id, report.kind)
    except binding.StaleReport as outdated:
        logger.info("node %s: %s dropped: %s", report.node_id, report.kind, outdated)
    except (binding.BindingRefused, ComputeError, PermissionError, ValueError) as refusal:
        reason = refusal.message if isinstance(refusal, ComputeError) else str(refusal)
        logger.warning("node %s: %s refused: %s", report.node_id, report.kind, reason)
        if refusal_action:
            sessions.node_report_refused(node_id=report.node_id, action=refusal_action,
                                         reason=reason)
    else:
        if report.kind in DEDUPLICATED:
            REPORT_DUPLICATES.inc(0 if outcome else 1)
