"""API methods usage.list, usage.report and usage.budgets."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import Input, ListInput
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import NUMBER, STRING, TIME, array, nullable, obj, page_of
from compute.core.db import database_now
from compute.platform.paging import page
from reservations import selectors
from reservations import usage_report as report
from reservations.budgets import budget_standing
from reservations.presenters import USAGE, present_usage
from reservations.selectors import offering_list


class UsageListIn(ListInput):
    meter = serializers.CharField(required=False, max_length=64)
    subject = serializers.CharField(required=False, max_length=40,
                                    help_text="Only this reservation's or sandbox's records.")


@endpoint("usage", "list", returns=page_of(USAGE), input=UsageListIn, mutating=False)
def usage_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Metered usage of the tenant, such as gpu.H100.hours, per ended window."""
    queryset = selectors.usage_list(tenant=ctx.tenant, meter=data.pop("meter", None),
                                    subject=data.pop("subject", None))
    return page(queryset, present=present_usage, **data)


class UsageReportIn(Input):
    report_from = serializers.DateTimeField(help_text="From this moment.")
    to = serializers.DateTimeField(help_text="Up to this moment (not included; at or before "
                                             "`from`: an empty report).")
    group_by = serializers.RegexField(
        rf"^({'|'.join(report.GROUPS)})(,({'|'.join(report.GROUPS)}))*$", max_length=100,
        default="meter",
        error_messages={"invalid": f"a comma-separated list of {', '.join(report.GROUPS)}"},
        help_text=f"Comma-separated, from {', '.join(report.GROUPS)} (day: UTC).")
    aliases = {"from": "report_from"}


REPORT_ROW = obj(tenant=nullable(STRING), pool=nullable(STRING), meter=nullable(STRING),
                 day=nullable(STRING), priorityClass=nullable(STRING), quantity=STRING)


@endpoint("usage", "report", returns=obj(**{"from": TIME}, to=TIME, groupBy=array(STRING),
                                          rows=array(REPORT_ROW)),
          input=UsageReportIn, mutating=False)
def usage_report(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Usage between two moments, summed per group: closed records for the part of their
    window inside it, and what runs since its last close. The root tenant's report covers
    every tenant."""
    group_by = tuple(dict.fromkeys(data["group_by"].split(",")))
    rows = report.usage_report(tenant=ctx.tenant, start=data["report_from"], end=data["to"],
                        now=database_now(), group_by=group_by)
    return {"from": data["report_from"], "to": data["to"], "groupBy": list(group_by),
            "rows": rows}


BUDGET = obj(poolId=STRING, tenant=STRING, gpuHours=NUMBER, period=STRING,
             priorityClass=nullable(STRING), periodStart=TIME, periodEnd=TIME, booked=STRING,
             used=STRING)


@endpoint("usage", "budgets", returns=obj(items=array(BUDGET)), input=Input, mutating=False)
def usage_budgets(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The GPU-hour budgets of the offerings the tenant received (or made), each in its
    current period: the budget, what is booked in it (future bookings too) and what was
    used so far."""
    now = database_now()
    items = []
    for offering in offering_list(tenant=ctx.tenant):
        for standing in budget_standing(offering.limits, tenant_id=offering.tenant_id,
                                        pool=offering.pool, now=now):
            items.append({"poolId": offering.pool_id, "tenant": offering.tenant.slug,
                          **standing})
    return {"items": items}
