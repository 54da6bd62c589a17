"""The node reports the ledger applies (fleet.reports verifies and dispatches them)."""

from __future__ import annotations

from fleet.reports import report_kind
from reservations.services import binding, sandbox_reports

report_kind("bound", binding.allocation_bound_record)
report_kind("released", binding.allocation_released_record, refusal_action="allocation.release")
report_kind("failed", binding.allocation_failed_record, refusal_action="reservation.bind")
report_kind("vm", sandbox_reports.vm_report_record)
