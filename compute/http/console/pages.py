"""The console's pages. Each reads through the API methods it mirrors (`Page.call`)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from datetime import UTC, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from compute.core.errors import ComputeError
from compute.http.console.calendar import SPANS, STEPS, View, layout
from compute.http.console.session import Page, console_page
from compute.platform.events.presenters import present_event
from compute.platform.events.selectors import event_head, latest_events
from compute.platform.tenancy.selectors import principal_names
from fleet.selectors import node_hostnames
from reservations.board import (
    fleet_board,
    gpus_held_now,
    reservations_on_node,
    sandboxes_on_node,
)
from reservations.models import ReservationState, Topology

FEED_LENGTH = 50


@console_page
def board(request: HttpRequest, page: Page) -> HttpResponse:
    """The fleet board: a tile per node, the totals, and the live events feed."""
    page.call("nodes.list", limit=1)  # decided like the API's nodes.list
    events = [present_event(e) for e in latest_events(tenant=page.tenant, count=FEED_LENGTH)]
    return page.render("console/board.html", {"board": fleet_board(tenant=page.tenant),
                                              "events": events})


@console_page
def board_tiles(request: HttpRequest, page: Page) -> HttpResponse:
    """The tiles and totals alone, which the board fetches again when events arrive."""
    page.call("nodes.list", limit=1)
    return page.render("console/_tiles.html", {"board": fleet_board(tenant=page.tenant)})


@console_page
def pools(request: HttpRequest, page: Page) -> HttpResponse:
    """Each pool with its capacity rollup, policy, offerings with their quotas, and each
    tenant's fair share."""
    offered: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if page.can("offerings.list"):
        for offering in page.call("offerings.list", limit=1000)["items"]:
            offered[offering["poolId"]].append(offering)
    rows = [{"pool": pool, "capacity": page.call("capacity.get", poolId=pool["id"]),
             "offerings": offered[pool["id"]],
             "shares": page.call("capacity.shares", poolId=pool["id"])["tenants"]
             if pool["class"] == "metal-host" else []}
            for pool in page.call("pools.list", limit=1000)["items"]]
    return page.render("console/pools.html", {"rows": rows})


@console_page
def reservations(request: HttpRequest, page: Page) -> HttpResponse:
    """Reservations, filtered by state and pool (and tenant, through ?tenant=), and the
    pending queue: each waiting request's position, class, fair share and why."""
    state, pool_id = request.GET.get("state") or None, request.GET.get("pool") or None
    filters = {k: v for k, v in {"state": state, "poolId": pool_id}.items() if v}
    items = with_node_names(page, page.call("reservations.list", limit=1000, **filters)["items"])
    pool_list = page.call("pools.list", limit=1000)["items"]
    return page.render("console/reservations.html", {
        "items": list(reversed(items)), "pools": pool_list, "states": ReservationState.values,
        "state": state or "", "pool_id": pool_id or "",
        "topologies": Topology.choices, "reserve_allowed": page.can("reservations.create"),
        "release_allowed": page.can("reservations.release"),
        "series": page.call("series.list", limit=1000)["items"],
        "series_release_allowed": page.can("series.release"),
        "queue": page.call("reservations.queue", **({"poolId": pool_id} if pool_id else {}))[
            "items"] if page.can("reservations.queue") else [],
        "tenants": page.call("tenants.list", limit=1000)["items"] if page.is_root else []})


def with_node_names(page: Page, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reservations with `nodeName`: their node's hostname where the tenant may list its
    nodes, else the node's id."""
    names = ({n["id"]: n["hostname"] for n in page.call("nodes.list", limit=1000)["items"]}
             if any(r["nodeId"] for r in items) and page.can("nodes.list") else {})
    return [{**r, "nodeName": names.get(r["nodeId"]) or r["nodeId"]} for r in items]


@console_page
def reservation(request: HttpRequest, page: Page, reservation_id: str) -> HttpResponse:
    """One reservation with its binding, its events and its audit rows."""
    [found] = with_node_names(page, [page.call("reservations.get", reservationId=reservation_id)])
    events = page.call("events.list", subject=reservation_id, limit=1000)["items"]
    rows = (page.call("audit.list", target=reservation_id, limit=1000)["items"]
            if page.can("audit.list") else None)
    return page.render("console/reservation.html",
                       {"rsv": found, "events": events, "audit_rows": rows})


@console_page
def sandboxes(request: HttpRequest, page: Page) -> HttpResponse:
    """Sandboxes: vCPUs and memory claimed from the same ledger."""
    return _newest_first_with_pools(page, "console/sandboxes.html", "sandboxes",
                                    live_states=["placed", "starting", "running", "paused"])


@console_page
def sandbox(request: HttpRequest, page: Page, sandbox_id: str) -> HttpResponse:
    """One sandbox: its state, size, image, network, uptime, the last lines of its console
    (read from its node), and what can be done to it."""
    found = page.call("sandboxes.get", sandboxId=sandbox_id)
    image = (page.call("images.get", imageId=found["imageId"])
             if found["imageId"] and page.can("images.get") else None)
    console: list[str] | None = None
    console_error = ""
    if found["state"] in ("starting", "running", "paused"):
        try:
            console = page.call("sandboxes.logs", sandboxId=sandbox_id, lines=20)["lines"]
        except ComputeError as error:  # the node does not answer: the page still shows
            console_error = error.message
    started = found["startedAt"]
    if isinstance(started, str):
        started = parse_datetime(started)
    uptime = (timezone.now() - started).total_seconds() if started and not found[
        "endedAt"] else None
    return page.render("console/sandbox.html", {
        "sbx": found, "image": image, "console": console, "console_error": console_error,
        "uptime": uptime, "can_act": page.can("sandboxes.pause")})


@console_page
def nodes(request: HttpRequest, page: Page) -> HttpResponse:
    can_enroll = page.can("nodes.enroll")
    return page.render("console/nodes.html", {
        "items": page.call("nodes.list", limit=1000)["items"], "can_enroll": can_enroll,
        "pools": page.call("pools.list", limit=1000)["items"] if can_enroll else []})


DEPLOYABLE = ("available", "deploy-failed")


@console_page
def node(request: HttpRequest, page: Page, node_id: str) -> HttpResponse:
    """One node: inventory, conditions, connectivity, events, and its actions."""
    found = page.call("nodes.get", nodeId=node_id)
    events = page.call("nodes.events", nodeId=node_id, limit=100)["items"]
    held = gpus_held_now(found["id"])  # the node is the tenant's: nodes.get said so
    images = (page.call("images.list", poolId=found["poolId"], limit=1000)["items"]
              if found["bmc"] and found["provisionState"] in DEPLOYABLE else [])
    return page.render("console/node.html", {"node": found, "events": events, "held": held,
                                             "sandboxes": sandboxes_on_node(found["id"]),
                                             "reservations": reservations_on_node(found["id"]),
                                             "can_act": page.can("nodes.cordon"),
                                             "disk_images": [i for i in images if i.get("disk")]})


@console_page
def join_tokens(request: HttpRequest, page: Page) -> HttpResponse:
    return _newest_first_with_pools(page, "console/join_tokens.html", "joinTokens")


@console_page
def webhooks(request: HttpRequest, page: Page) -> HttpResponse:
    """Webhooks: each subscription with its latest deliveries (a dead one can be sent
    again), a form to subscribe (the secret shown once) and one to delete."""
    subscriptions = page.call("webhooks.list", limit=100)["items"]
    for subscription in subscriptions:
        subscription["deliveries"] = page.call("webhooks.deliveries", limit=20,
                                               webhookId=subscription["id"])["items"]
    return page.render("console/webhooks.html", {
        "items": subscriptions, "can_act": page.can("webhooks.create")})


def _newest_first_with_pools(page: Page, template: str, group: str,
                             **extra: Any) -> HttpResponse:
    """A list page with a create form over the tenant's pools (shown only if allowed)."""
    return page.render(template, {
        "items": list(reversed(page.call(f"{group}.list", limit=1000)["items"])),
        "pools": page.call("pools.list", limit=1000)["items"],
        "can_act": page.can(f"{group}.create"), **extra})


@console_page
def tenants(request: HttpRequest, page: Page) -> HttpResponse:
    """Tenants and the offerings of pools to them (root administrators only)."""
    page.decide("tenants.create")
    tenant_list = page.call("tenants.list", limit=1000)["items"]
    return page.render("console/tenants.html", {
        "tenants": tenant_list, "pools": page.call("pools.list", limit=1000)["items"],
        "offerings": page.call("offerings.list", limit=1000)["items"]})


@console_page
def audit_proof(request: HttpRequest, page: Page, event_id: str) -> HttpResponse:
    """One audit row's inclusion proof, as a file. Written here, not in the browser: a
    browser's JSON rounds integers past 2**53 (a journal epoch), which would change the
    row the proof is about, and the proof would no longer verify."""
    proof = page.call("audit.prove", eventId=event_id)
    response = HttpResponse(json.dumps(proof, indent=2, cls=DjangoJSONEncoder),
                            content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="proof-{proof["event"]["id"]}.json"'
    return response


AUDIT_PAGE = 50
NEWEST = 2**62  # `before` that lists the newest rows


@console_page
def audit(request: HttpRequest, page: Page) -> HttpResponse:
    """The tenant's audit log, newest first, a page at a time (older and newer pages by
    position), with verify, a proof per row, and each actor by name."""
    since, before = (int(request.GET[k]) if request.GET.get(k, "").isdigit() else None
                     for k in ("since", "before"))
    window = {"since": since} if since is not None else {"before": before or NEWEST}
    rows = list(reversed(page.call("audit.list", limit=AUDIT_PAGE, **window)["items"]))
    named = {**principal_names([r["actorId"] for r in rows]),
             **node_hostnames(tenant=page.tenant, ids=[r["actorId"] for r in rows])}
    rows = [{**r, "actorName": named.get(r["actorId"]) or r["actorId"]} for r in rows]
    positions = [r["position"] for r in rows if r["position"]]
    return page.render("console/audit.html", {
        "rows": rows,
        "older": min(positions) if positions and min(positions) > 1 else None,
        "newer": max(positions) if positions and (since is not None or before) else None,
        "checkpoints": page.call("audit.checkpoints", limit=20)["items"],
        "can_checkpoint": page.can("audit.checkpoint")})


REPORT_GROUPS = ("tenant", "pool", "meter", "day", "priorityClass")


def report_query(request: HttpRequest, page: Page) -> dict[str, str]:
    """The report's window and grouping from the page's query: by default the last 14 days
    (UTC) by day and meter, and by tenant too for the root tenant."""
    today = timezone.now().astimezone(UTC).date()
    start = request.GET.get("from") or (today - timedelta(days=13)).isoformat()
    end = request.GET.get("to") or (today + timedelta(days=1)).isoformat()
    default = "tenant,day,meter" if page.is_root else "day,meter"
    groups = [g for g in request.GET.getlist("groupBy") if g in REPORT_GROUPS]
    return {"from": start, "to": end, "groupBy": ",".join(groups) or default}


@console_page
def usage(request: HttpRequest, page: Page) -> HttpResponse:
    """Usage over a window (usage.report), grouped as asked, with GPU-hours per day drawn as
    an SVG chart, a CSV of the same rows, and the latest records."""
    query = report_query(request, page)
    report = page.call("usage.report", **query)
    per_day = report if {"day", "meter"} <= set(report["groupBy"]) else page.call(
        "usage.report", **{**query, "groupBy": "day,meter"})
    columns = [g for g in REPORT_GROUPS if g in report["groupBy"]]
    return page.render("console/usage.html", {
        "query": query, "columns": columns, "groups": REPORT_GROUPS,
        "rows": [{"values": [row[c] or "" for c in columns], "quantity": row["quantity"]}
                 for row in report["rows"]],
        "csv": urlencode([("from", query["from"]), ("to", query["to"]),
                          *(("groupBy", g) for g in report["groupBy"])]),
        "items": page.call("usage.list", limit=100)["items"],
        "budgets": page.call("usage.budgets")["items"],
        "chart": gpu_hours_chart(per_day["rows"])})


@console_page
def usage_csv(request: HttpRequest, page: Page) -> HttpResponse:
    """The usage report's rows as CSV, one column per group and the quantity."""
    report = page.call("usage.report", **report_query(request, page))
    columns = [g for g in REPORT_GROUPS if g in report["groupBy"]]
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = (f'attachment; filename="usage-{report["from"]:%Y%m%d}-'
                                       f'{report["to"]:%Y%m%d}.csv"')
    writer = csv.writer(response)
    writer.writerow([*columns, "quantity"])
    writer.writerows([*(row[c] or "" for c in columns), row["quantity"]]
                     for row in report["rows"])
    return response


def gpu_hours_chart(rows: list[dict[str, Any]], *, days: int = 14) -> dict[str, Any]:
    """Bars of GPU-hours per day (meters gpu.*.hours, from report rows with a day),
    scaled to the busiest day."""
    per_day: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        meter = row.get("meter") or ""
        if meter.startswith("gpu.") and meter.endswith(".hours") and row.get("day"):
            per_day[row["day"]] += Decimal(row["quantity"])
    ordered = sorted(per_day.items())[-days:]
    peak = max((v for _, v in ordered), default=Decimal(0)) or Decimal(1)
    bars = []
    for i, (day, value) in enumerate(ordered):
        height = round(float(value / peak) * 160, 1)
        bars.append({"day": day, "hours": round(float(value), 2), "x": 40 + i * 44,
                     "y": 180 - height, "height": height})
    return {"bars": bars, "peak": round(float(peak), 2), "width": 60 + 44 * max(len(bars), 1)}


@console_page
def pool(request: HttpRequest, page: Page, pool_id: str) -> HttpResponse:
    """One pool's calendar: a row per GPU, bookings as bars, what waits at its start, and
    booked against bookable GPUs over time; it follows the events stream."""
    found = page.call("pools.get", poolId=pool_id)
    return page.render("console/pool.html", {
        "pool": found, **calendar_context(request, page, pool_id), "spans": list(SPANS),
        "since": event_head(tenant=page.tenant), "can_preview": page.can("capacity.preview"),
        "whatif_gpus": 8 if found["class"] == "metal-host" else 1})


@console_page
def pool_calendar(request: HttpRequest, page: Page, pool_id: str) -> HttpResponse:
    """The calendar alone, which the pool page fetches again when events arrive."""
    return page.render("console/_calendar.html", calendar_context(request, page, pool_id))


def calendar_context(request: HttpRequest, page: Page, pool_id: str) -> dict[str, Any]:
    view = View.of(request.GET.dict(), timezone.now())  # the axis is drawn on this clock
    timeline = page.call("capacity.timeline", poolId=pool_id, resolution=int(
        STEPS[view.span].total_seconds() * 1000), **{"from": view.start, "to": view.end})
    return {"view": view, "links": view.links(), "query": view.query(),
            "calendar": layout(timeline, view), "truncated": timeline["truncated"],
            "step": format_step(STEPS[view.span]), "pending_list": timeline["pending"]}


def format_step(step: timedelta) -> str:
    minutes = int(step.total_seconds() // 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h"
