"""Commands over capacity: nodes, capacity, reserve, reservations, release, extend,
sandboxes, usage."""

from __future__ import annotations

import base64
import csv
import shutil
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from compute.cli.common import api_command, call_and_show, output_options, show
from compute.cli.common import client as make_client
from compute.cli.durations import Duration
from compute.cli.output import table
from compute.cli.timeline_text import timeline_text

RESERVATION_COLUMNS = ["id", "state", "poolId", "nodeId", "start", "end"]
QUEUE_COLUMNS = ["position", "reservationId", "poolId", "count", "priorityClass", "fairShare",
                 "plannedStart", "why"]
SHARE_COLUMNS = ["tenant", "share", "sharePart", "usageGpuHours", "usagePart", "factor"]


@click.group()
def nodes() -> None:
    """Machines in your pools."""


@api_command(nodes, "list", "nodes.list",
             columns=["id", "hostname", "provisionState", "connectivity", "cordoned",
                      "vcpusAllocated", "vcpus", "agentVersion"])
@click.option("--pool", "pool_id", default=None)
def nodes_list(pool_id: str | None) -> dict[str, Any]:
    """Nodes, optionally of one pool."""
    return {"poolId": pool_id}


@api_command(nodes, "get", "nodes.get")
@click.argument("node_id")
def nodes_get(node_id: str) -> dict[str, Any]:
    """One node with its conditions and devices."""
    return {"nodeId": node_id}


@api_command(nodes, "events", "nodes.events", columns=["seq", "type", "createdAt"])
@click.argument("node_id")
@click.option("--since", type=int, default=None)
def nodes_events(node_id: str, since: int | None) -> dict[str, Any]:
    """Events about one node, oldest first."""
    return {"nodeId": node_id, "since": since}


@api_command(nodes, "cordon", "nodes.cordon")
@click.argument("node_id")
@click.option("--reason", default=None)
def nodes_cordon(node_id: str, reason: str | None) -> dict[str, Any]:
    """Stop placing on a node (what it holds stays)."""
    return {"nodeId": node_id, "reason": reason}


@api_command(nodes, "adopt", "nodes.adopt")
@click.argument("node_id")
@click.option("--reason", required=True, help="What was fixed, e.g. 'GPU 3 reseated'.")
def nodes_adopt(node_id: str, reason: str) -> dict[str, Any]:
    """Start a new acceptance attempt after a failed one."""
    return {"nodeId": node_id, "reason": reason}


@api_command(nodes, "uncordon", "nodes.uncordon")
@click.argument("node_id")
@click.option("--reason", default=None)
def nodes_uncordon(node_id: str, reason: str | None) -> dict[str, Any]:
    """Let the placer use a node again."""
    return {"nodeId": node_id, "reason": reason}


@api_command(nodes, "retire", "nodes.retire")
@click.argument("node_id")
@click.option("--reason", required=True,
              help="Why, e.g. 'joined twice by mistake'. Refused while it holds anything.")
def nodes_retire(node_id: str, reason: str) -> dict[str, Any]:
    """Take a node out of the fleet for good (it may not connect again)."""
    return {"nodeId": node_id, "reason": reason}


@api_command(nodes, "maintenance", "maintenance.create")
@click.argument("node_id")
@click.option("--from", "start", default=None,
              help="When it starts: +2h (from now) or an ISO 8601 time; absent: now.")
@click.option("--for", "duration", type=Duration(), required=True, help="How long, e.g. 4h.")
@click.option("--reason", required=True, help="Why, e.g. 'PSU swap'.")
@click.option("--move", is_flag=True,
              help="Place the bookings in the way that have not started on other nodes.")
def nodes_maintenance(node_id: str, start: str | None, duration: int, reason: str,
                      move: bool) -> dict[str, Any]:
    """Take a node out of service for a window: refused naming the bookings it overlaps,
    unless --move places them elsewhere (all or none)."""
    return {"nodeId": node_id, "duration": duration, "reason": reason, "move": move,
            **time_fields("start", start)}


@click.group()
def maintenance() -> None:
    """Maintenance windows of your nodes."""


@api_command(maintenance, "list", "maintenance.list",
             columns=["id", "nodeId", "start", "end", "reason", "cancelledAt"])
@click.option("--node", "node_id", default=None)
def maintenance_list(node_id: str | None) -> dict[str, Any]:
    """Windows, optionally of one node."""
    return {"nodeId": node_id}


@api_command(maintenance, "cancel", "maintenance.cancel")
@click.argument("window_id")
@click.option("--reason", default=None)
def maintenance_cancel(window_id: str, reason: str | None) -> dict[str, Any]:
    """End a window now, or drop it before it starts."""
    return {"windowId": window_id, "reason": reason}


def request_shape(pool: str, gpus: int, duration: int, nvlink: bool, model: str | None,
                  product: str | None, selector: str | None, mig: str | None = None,
                  share: bool = False) -> dict[str, Any]:
    if mig and share:
        raise click.UsageError("--mig and --share ask for different atoms: give one")
    device: dict[str, Any] = {"class": "mig" if mig else "gpu-share" if share else "gpu",
                              "count": gpus, "topology": "nvlink-all" if nvlink else "any"}
    return {"poolId": pool, "duration": duration, "model": model, "product": product,
            "selector": selector, "devices": [{**device, "profile": mig} if mig else device]}


ATOM_OPTIONS = [
    click.option("--mig", default=None, metavar="PROFILE",
                 help="MIG instances of this profile (e.g. 1g.10gb) instead of whole GPUs; "
                      "--gpus counts instances."),
    click.option("--share", is_flag=True,
                 help="Time-sliced shares of a GPU (pools that slice GPUs); --gpus counts "
                      "shares."),
]


def shape_options(func: Any) -> Any:
    for option in reversed([
        click.option("--pool", required=True, help="Pool id."),
        click.option("--gpus", type=click.IntRange(1, 64), default=None,
                     help="How many GPUs (or MIG instances, or shares)."),
        click.option("--for", "duration", type=Duration(), default=None,
                     help="How long, e.g. 2h (required unless --every)."),
        click.option("--nvlink", is_flag=True, help="All GPUs in one NVLink domain."),
        click.option("--model", default=None,
                     help="GPU family, e.g. H100; to reserve, several as T4|P100: the best "
                          "of your pools in the pool's site with one of them."),
        click.option("--product", default=None, help="Exact product, e.g. H100-SXM5-80GB."),
        click.option("--selector", default=None, help="e.g. 'vramGiB >= 80'."),
        *ATOM_OPTIONS,
    ]):
        func = option(func)
    return func


def atom_options(func: Any) -> Any:
    for option in reversed(ATOM_OPTIONS):
        func = option(func)
    return func


@click.command("capacity")
@click.option("--pool", required=True, help="Pool id.")
@click.option("--preview", is_flag=True, help="Ask whether a request would fit now.")
@click.option("--earliest", is_flag=True,
              help="Ask when a request fits first, on which node and GPUs.")
@click.option("--shares", is_flag=True,
              help="Each tenant's fair share: its weight, decayed usage and factor.")
@click.option("--timeline", is_flag=True,
              help="Who holds which GPU when, what waits, and booked against bookable GPUs "
                   "over time (from --from, for --for, default the next day).")
@click.option("--from", "start_from", default=None,
              help="With --timeline: where it starts, -2h (before now) or an ISO 8601 time.")
@click.option("--resolution", type=Duration(minimum="1m"), default=None,
              help="With --timeline: the utilisation step, 1h (default: 96 steps).")
@click.option("--gpus", type=click.IntRange(1, 64), default=None)
@click.option("--nodes", type=click.IntRange(1, 64), default=1,
              help="With --preview or --earliest: a gang of that many nodes with --gpus "
                   "each; which nodes, in how many racks and rails.")
@click.option("--for", "duration", type=Duration(), default=None)
@click.option("--nvlink", is_flag=True)
@click.option("--model", default=None)
@click.option("--product", default=None)
@click.option("--selector", default=None)
@click.option("--start", "start", default=None,
              help="With --preview: a later start, +2h (from now) or an ISO 8601 time.")
@click.option("--after", default=None,
              help="With --earliest: start no sooner, +2h (from now) or an ISO 8601 time.")
@click.option("--before", default=None,
              help="With --earliest: end by then, +3d (from now) or an ISO 8601 time.")
@atom_options
@output_options
def capacity(pool: str, preview: bool, earliest: bool, shares: bool, timeline: bool,
             start_from: str | None, resolution: int | None, gpus: int | None, nodes: int,
             duration: int | None, nvlink: bool, model: str | None, product: str | None,
             selector: str | None, start: str | None, after: str | None, before: str | None,
             mig: str | None, share: bool, output: str | None, query: str | None,
             tenant: str | None) -> None:
    """A pool's capacity; with --preview --gpus N --for 2h [--start +2h], whether a request
    would fit, and if not why; with --earliest --gpus N --for 4h [--after T] [--before T],
    the earliest window where it fits; with --shares, each tenant's fair share; with
    --timeline [--from -2h] [--for 3d], the pool's calendar in text."""
    api = make_client()
    if timeline:
        result = api.call("capacity.timeline", timeline_body(pool, start_from, duration,
                                                             resolution), tenant=tenant)
        if (output or ("table" if sys.stdout.isatty() else "json")) in ("table", "wide") \
                and not query:
            click.echo(timeline_text(result, shutil.get_terminal_size().columns))
        else:
            show(result, output=output, query=query)
        return
    if shares:
        result = api.call("capacity.shares", {"poolId": pool}, tenant=tenant)
        as_table = (output or ("table" if sys.stdout.isatty() else "json")) in ("table", "wide")
        if as_table and not query:
            click.echo(f"usage counts half after {result['halfLifeHours']:g} h")
            show(result["tenants"], output=output, query=None, columns=SHARE_COLUMNS)
        else:
            show(result, output=output, query=query)
        return
    if not (preview or earliest):
        result = api.call("capacity.get", {"poolId": pool}, tenant=tenant)
        as_table = (output or ("table" if sys.stdout.isatty() else "json")) in ("table", "wide")
        if as_table and not query:
            click.echo(capacity_text(result))
        else:
            show(result, output=output, query=query)
        return
    if preview and earliest:
        raise click.UsageError("--preview and --earliest ask different questions: give one")
    if gpus is None or duration is None:
        raise click.UsageError(f"--{'preview' if preview else 'earliest'} needs --gpus and --for")
    body = request_shape(pool, gpus, duration, nvlink, model, product, selector, mig, share)
    body.pop("model")
    if nodes > 1:
        body["nodes"] = nodes
    if preview:
        body.update(time_fields("start", start))
        show(api.call("capacity.preview", body, tenant=tenant), output=output, query=query)
        return
    body.update({**time_fields("after", after), **time_fields("before", before)})
    show(api.call("capacity.earliest", body, tenant=tenant), output=output, query=query)


def timeline_body(pool: str, start_from: str | None, duration: int | None,
                  resolution: int | None) -> dict[str, Any]:
    """`--from` (-2h before now, +1h after, or an ISO 8601 time) and `--for` as the API's
    window; by default from an hour ago, for a day."""
    text = start_from or "-1h"
    try:
        if text[0] in "+-":
            offset = Duration().convert(text[1:], None, None) * (-1 if text[0] == "-" else 1)
            start = datetime.now(UTC) + timedelta(milliseconds=offset)
        else:
            start = datetime.fromisoformat(text)
    except (ValueError, click.BadParameter):
        raise click.BadParameter(f"{text!r} is neither -2h (before now), +1h nor an ISO 8601 "
                                 "time", param_hint="--from") from None
    body = {"poolId": pool, "from": start.isoformat(),
            "to": (start + timedelta(milliseconds=duration or 86_400_000)).isoformat()}
    return {**body, **({"resolution": resolution} if resolution else {})}


CAPACITY_COLUMNS = ["resource", "total", "allocatable", "allocated", "reserved", "available"]


def capacity_text(result: dict[str, Any]) -> str:
    """`capacity.get` as a terminal shows it: a line on the pool, then one row a resource
    (GPUs, each MIG profile or share, vCPUs, memory) and what keeps GPUs from placement."""
    rows = [{"resource": "gpu", **result["gpu"]},
            *({"resource": f"{part['class']} {part['profile'] or ''}".strip(),
               "total": part["total"], "available": part["available"]}
              for part in result["parts"]),
            {"resource": "vcpu", **result["vcpu"]},
            {"resource": "memory GiB", **result["memoryGiB"]}]
    head = (f"pool {result['poolId']} ({result['gpuModel'] or 'no GPUs'}): "
            f"{result['nodes']} node(s), {result['pending']} pending, at {result['at']}")
    away = {why: n for why, n in result["gpusNotSchedulable"].items() if n}
    tail = ("GPUs not schedulable: " + ", ".join(f"{n} {why}" for why, n in away.items())
            if away else "")
    return "\n".join(filter(None, [head, table(rows, CAPACITY_COLUMNS), tail]))


def time_fields(name: str, text: str | None) -> dict[str, Any]:
    """`--<name> +2h` (from now, on the server's clock) or an ISO 8601 time, as the API's
    `<name>In` or `<name>`."""
    if not text:
        return {}
    if text.startswith("+"):
        return {f"{name}In": Duration().convert(text[1:], None, None)}
    return {name: text}


@click.command("reserve")
@shape_options
@click.option("--start", "start", default=None,
              help="Later start: +2h (from now) or an ISO 8601 time.")
@click.option("--at-earliest", "at_earliest", is_flag=True,
              help="Book the earliest window from --start (or now) where it fits.")
@click.option("--before", default=None,
              help="With --at-earliest: end by then, +3d (from now) or an ISO 8601 time.")
@click.option("--every", default=None, metavar="RULE",
              help="Recurring: '<days> HH:MM-HH:MM', days daily, weekdays, weekends or "
                   "mon,wed,fri; e.g. 'weekdays 09:00-17:00'.")
@click.option("--until", default=None, metavar="DATE",
              help="With --every: the last day (YYYY-MM-DD).")
@click.option("--from", "first_day", default=None, metavar="DATE",
              help="With --every: the first day (default today).")
@click.option("--tz", "time_zone", default="UTC", show_default=True,
              help="With --every: the rule's wall clock, e.g. Europe/Berlin.")
@click.option("--horizon-days", type=click.IntRange(1, 366), default=14, show_default=True,
              help="With --every: how far ahead occurrences are booked.")
@click.option("--kubernetes", is_flag=True, help="Hold for the node's Kubernetes workers.")
@click.option("--slurm", "slurm_account", default=None, metavar="ACCOUNT",
              help="Publish the hold to the node's Slurm for this account (the pool's policy "
                   "names the cluster).")
@click.option("--fraction", type=click.FloatRange(0.001, 1), default=None,
              help="Instead of --gpus: this part of one GPU (e.g. 0.22), booked as the fewest "
                   "time-sliced shares of one GPU that cover it.")
@click.option("--priority-class", "priority_class", default=None,
              help="A priority class the pool grants you: high, normal (the default), "
                   "preemptible, or one of the pool's own.")
@click.option("--nodes", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Nodes, each with --gpus: above 1, booked together close together (one "
                   "rack, one rail where they fit) or not at all.")
@click.option("--key", default=None, help="Idempotency key; a new one is made and printed.")
@click.option("--wait", type=click.FloatRange(0, 3600), default=20.0, show_default=True,
              help="Seconds to wait for placement.")
@output_options
def reserve(pool: str, gpus: int | None, duration: int | None, nvlink: bool, model: str | None,
            product: str | None, selector: str | None, mig: str | None, share: bool,
            start: str | None,
            at_earliest: bool, before: str | None, every: str | None, until: str | None,
            first_day: str | None, time_zone: str, horizon_days: int, kubernetes: bool,
            slurm_account: str | None, fraction: float | None, priority_class: str | None,
            nodes: int, key: str | None, wait: float, output: str | None,
            query: str | None, tenant: str | None) -> None:
    """Reserve GPUs for a window (or, with --at-earliest, the earliest window where they
    fit; with --every, on every window of a rule until a day); retry with --key KEY to never
    book twice."""
    if (gpus is None) == (fraction is None):
        raise click.UsageError("give --gpus N, or --fraction F for a part of one GPU")
    if fraction is not None and (mig or nvlink):
        raise click.UsageError("--fraction is a part of one GPU: drop --mig and --nvlink")
    if every and (mig or share or fraction):
        raise click.UsageError("--every books whole GPUs: drop --mig, --share and --fraction")
    if every:
        reserve_every(pool, gpus or 1, nvlink, product, selector, every, until, first_day,
                      time_zone, horizon_days, clashing={"--for": duration, "--start": start,
                                                         "--nodes": nodes > 1,
                                                         "--at-earliest": at_earliest,
                                                         "--kubernetes": kubernetes,
                                                         "--slurm": slurm_account,
                                                         "--priority-class": priority_class},
                      output=output, query=query, tenant=tenant)
        return
    if duration is None:
        raise click.UsageError("--for is required (or --every for a recurring reservation)")
    if before and not at_earliest:
        raise click.UsageError("--before goes with --at-earliest")
    key = key or str(uuid.uuid4())
    click.echo(f"idempotency key: {key}", err=True)
    models = [m.strip() for m in model.split("|") if m.strip()] if model and "|" in model \
        else None
    body = {**request_shape(pool, gpus or 1, duration, nvlink, None if models else model, product,
                            selector, mig, share),
            "kubernetes": kubernetes or None, "slurm": slurm_account,
            "priorityClass": priority_class, "idempotencyKey": key, "binding": "hold",
            "atEarliest": at_earliest or None, **time_fields("start", start),
            **time_fields("before", before), **({"nodes": nodes} if nodes > 1 else {})}
    if fraction is not None:  # counted in shares by the pool that books it
        body["devices"] = [{"class": "gpu-share", "fraction": fraction}]
    if models:  # any of these: the best of the site's pools that has one
        body["devices"][0]["models"] = models
    api = make_client()
    result = api.call("reservations.create", body, tenant=tenant)
    # A reservation that starts now is followed until the node holds it (active).
    later = start or (at_earliest and result.get("start") and result["state"] == "placed"
                      and result["start"] > result["createdAt"])
    settling = ("pending",) if later else ("pending", "placed", "binding")
    click.echo(f"reservation: {result['id']}", err=True)  # on its own line, to copy
    result = wait_for(api, result, wait, tenant, settling)
    show(result, output=output, query=query)


def reserve_every(pool: str, gpus: int, nvlink: bool, product: str | None,
                  selector: str | None, every: str, until: str | None,
                  first_day: str | None, time_zone: str, horizon_days: int, *,
                  clashing: dict[str, Any], output: str | None, query: str | None,
                  tenant: str | None) -> None:
    """`reserve --every`: a series of reservations (series.create)."""
    given = [name for name, value in clashing.items() if value]
    if given:
        raise click.UsageError(f"--every sets each window itself: drop {', '.join(given)}")
    if not until:
        raise click.UsageError("--every needs --until DATE")
    body = {"poolId": pool, "devices": [{"class": "gpu", "count": gpus,
                                         "topology": "nvlink-all" if nvlink else "any"}],
            "every": every, "timezone": time_zone, "until": until, "horizonDays": horizon_days,
            "product": product, "selector": selector, "from": first_day}
    show(make_client().call("series.create", {k: v for k, v in body.items() if v is not None},
                            tenant=tenant), output=output, query=query)


def wait_for(api: Any, result: dict[str, Any], seconds: float, tenant: str | None,
             settling: tuple[str, ...] = ("pending",), *,
             get: tuple[str, str] = ("reservations.get", "reservationId")) -> dict[str, Any]:
    """Poll while the reservation (or what `get` reads) is settling, with a progress line
    on a terminal."""
    deadline = time.monotonic() + seconds
    frames, tick = "|/-\\", 0
    tty = sys.stderr.isatty()
    while result["state"] in settling and time.monotonic() < deadline:
        if tty:
            left = deadline - time.monotonic()
            click.echo(f"\r{frames[tick % 4]} {result['id']} {result['state']}, waiting "
                       f"{left:4.0f}s", err=True, nl=False)
            tick += 1
        time.sleep(0.5)
        result = api.call(get[0], {get[1]: result["id"]}, tenant=tenant)
    if tty and tick:
        click.echo("\r" + " " * 60 + "\r", err=True, nl=False)
    if result["state"] == "pending":
        click.echo(f"{result['id']} is still pending: it is placed when capacity frees",
                   err=True)
    return result


@click.group()
def reservations() -> None:
    """GPU reservations."""


@api_command(reservations, "get", "reservations.get")
@click.argument("reservation_id")
def reservations_get(reservation_id: str) -> dict[str, Any]:
    """One reservation (--query state, --query binding)."""
    return {"reservationId": reservation_id}


@reservations.command("list")
@click.option("--pool", "pool_id", default=None)
@click.option("--state", default=None)
@click.option("--pending", is_flag=True,
              help="The pending queue instead: each request's position and why it waits.")
@output_options
def reservations_list(pool_id: str | None, state: str | None, pending: bool,
                      output: str | None, query: str | None, tenant: str | None) -> None:
    """Your reservations, oldest first; with --pending, your pending requests in the order
    they are offered capacity (all of a pool you own)."""
    if pending and state:
        raise click.UsageError("--pending lists pending requests: drop --state")
    if pending:
        call_and_show("reservations.queue", {"poolId": pool_id}, tenant=tenant, output=output,
                      query=query, columns=QUEUE_COLUMNS)
        return
    call_and_show("reservations.list", {"poolId": pool_id, "state": state}, tenant=tenant,
                  output=output, query=query, columns=RESERVATION_COLUMNS)


@click.command("release")
@click.argument("reservation_id")
@click.option("--cancel", is_flag=True, help="Only withdraw one that has not started.")
@output_options
def release(reservation_id: str, cancel: bool, output: str | None, query: str | None,
            tenant: str | None) -> None:
    """End a reservation now (bookings end at the database's time; quota is refunded)."""
    result = make_client().call("reservations.release",
                                {"reservationId": reservation_id, "cancel": cancel},
                                tenant=tenant)
    show(result, output=output, query=query)


@click.command("extend")
@click.argument("reservation_id")
@click.option("--by", "by", type=Duration(), required=True, help="How much longer, e.g. 2h.")
@output_options
def extend(reservation_id: str, by: int, output: str | None, query: str | None,
           tenant: str | None) -> None:
    """Make a reservation longer, if its GPUs are free for the extra time."""
    result = make_client().call("reservations.extend",
                                {"reservationId": reservation_id, "by": by}, tenant=tenant)
    show(result, output=output, query=query)


@click.group()
def sandboxes() -> None:
    """Sandbox VMs: vCPUs and memory from the same ledger."""


def forward_pair(text: str) -> dict[str, int]:
    host, sep, guest = text.partition(":")
    if not sep or not host.isdigit() or not guest.isdigit():
        raise click.BadParameter(f"{text!r} is not HOST_PORT:GUEST_PORT, e.g. 2222:22")
    return {"hostPort": int(host), "guestPort": int(guest)}


@sandboxes.command("create")
@click.option("--pool", "pool_id", required=True)
@click.option("--vcpus", type=click.IntRange(1, 256), required=True)
@click.option("--memory", "memory", type=click.IntRange(1, 4096), required=True,
              help="GiB.")
@click.option("--image", default=None, help="Image name or id (default: the pool's default).")
@click.option("--forward", "forwards", multiple=True, metavar="HOST:GUEST",
              help="Forward a TCP port of the node to the guest, e.g. 2222:22 (repeatable).")
@click.option("--name", default=None)
@click.option("--key", default=None, help="Idempotency key; a new one is made and printed.")
@click.option("--network", type=click.Choice(["none", "outbound"]), default=None,
              help="none (the default without --forward) or outbound, where the pool allows.")
@click.option("--timeout", "lifetime", type=click.IntRange(10), default=None,
              help="Release the sandbox this many seconds after it is created.")
@click.option("--wait", "wait", is_flag=True, help="Wait until the guest has booted.")
@click.option("--wait-timeout", type=click.FloatRange(0, 3600), default=300.0,
              show_default=True, help="Seconds --wait waits at most.")
@output_options
def sandboxes_create(pool_id: str, vcpus: int, memory: int, image: str | None,
                     forwards: tuple[str, ...], name: str | None, key: str | None,
                     network: str | None, lifetime: int | None, wait: bool,
                     wait_timeout: float, output: str | None, query: str | None,
                     tenant: str | None) -> None:
    """Start a sandbox VM with vCPUs and memory claimed on one node."""
    key = key or str(uuid.uuid4())
    click.echo(f"idempotency key: {key}", err=True)
    api = make_client()
    result = api.call("sandboxes.create", {
        "poolId": pool_id, "vcpus": vcpus, "memoryGiB": memory, "image": image,
        "forwards": [forward_pair(f) for f in forwards] or None, "name": name,
        "network": network, "timeoutSeconds": lifetime,
        "idempotencyKey": key}, tenant=tenant)
    if wait:
        result = wait_for(api, result, wait_timeout, tenant, ("placed", "starting"),
                          get=("sandboxes.get", "sandboxId"))
        if result["state"] == "failed":
            show(result, output=output, query=query)
            raise SystemExit(f"sandbox {result['id']} failed: {result['failureReason']}")
    show(result, output=output, query=query)


@sandboxes.command("logs")
@click.argument("sandbox_id")
@click.option("--lines", "-n", type=click.IntRange(1, 2000), default=50, show_default=True)
@output_options
def sandboxes_logs(sandbox_id: str, lines: int, output: str | None, query: str | None,
                   tenant: str | None) -> None:
    """The last lines of the VM's serial console (as text; --output json for the object)."""
    result = make_client().call("sandboxes.logs", {"sandboxId": sandbox_id, "lines": lines},
                                tenant=tenant)
    if output or query:
        show(result, output=output, query=query)
    else:
        click.echo("\n".join(result["lines"]))


@sandboxes.command("get")
@click.argument("sandbox_id")
@click.argument("remote", required=False)
@click.argument("local", required=False, type=click.Path(dir_okay=False, allow_dash=True))
@output_options
def sandboxes_get(sandbox_id: str, remote: str | None, local: str | None,
                  output: str | None, query: str | None, tenant: str | None) -> None:
    """One sandbox; with REMOTE LOCAL, copy the guest's file REMOTE to LOCAL (- for stdout)."""
    api = make_client()
    if remote is None:
        show(api.call("sandboxes.get", {"sandboxId": sandbox_id}, tenant=tenant),
             output=output, query=query)
        return
    if local is None:
        raise click.UsageError("name where the file goes: sandboxes get SBX REMOTE LOCAL")
    said = api.call("sandboxes.fetch", {"sandboxId": sandbox_id, "path": remote},
                    tenant=tenant)
    data = base64.b64decode(said["content"])
    with click.open_file(local, "wb") as target:
        target.write(data)
    if local != "-":
        click.echo(f"{remote} -> {local}: {len(data)} bytes", err=True)


@sandboxes.command("put")
@click.argument("sandbox_id")
@click.argument("local", type=click.File("rb"))
@click.argument("remote")
@output_options
def sandboxes_put(sandbox_id: str, local: Any, remote: str, output: str | None,
                  query: str | None, tenant: str | None) -> None:
    """Copy the file LOCAL (- for stdin) to REMOTE, an absolute path in the guest."""
    data = local.read()
    said = make_client().call("sandboxes.put", {
        "sandboxId": sandbox_id, "path": remote,
        "content": base64.b64encode(data).decode()}, tenant=tenant)
    if output or query:
        show(said, output=output, query=query)
    else:
        click.echo(f"{remote}: {said['bytes']} bytes written")


@sandboxes.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("sandbox_id")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--timeout", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True,
              help="Seconds after which the command (and all it started) is killed.")
@click.option("--follow", "-f", is_flag=True,
              help="Print the output as it comes (the command runs detached).")
@output_options
def sandboxes_exec(sandbox_id: str, argv: tuple[str, ...], timeout: float, follow: bool,
                   output: str | None, query: str | None, tenant: str | None) -> None:
    """Run a command in the sandbox: `sandboxes exec SBX -- CMD ARGS…`. Prints its output
    and exits with its exit code."""
    api = make_client(timeout=timeout + 60)  # the call answers once the command ended
    body = {"sandboxId": sandbox_id, "argv": list(argv), "timeoutSeconds": timeout,
            "detach": follow}
    result = api.call("sandboxes.exec", body, tenant=tenant)
    if follow:
        result = follow_output(api, sandbox_id, result["pid"], tenant)
    elif output or query:
        show(result, output=output, query=query)
    else:
        click.echo(result["stdout"], nl=False)
        click.echo(result["stderr"], nl=False, err=True)
    if result.get("timedOut"):
        click.echo(f"killed after {timeout:g} s", err=True)
    raise SystemExit(result["exitCode"] if result["exitCode"] is not None else 1)


def follow_output(api: Any, sandbox_id: str, pid: int, tenant: str | None) -> dict[str, Any]:
    """Print a detached command's output as it comes; its last answer once it ended."""
    offsets, pause = {"stdoutOffset": 0, "stderrOffset": 0}, 0.1
    ended: dict[str, Any] | None = None  # the guest tells how it ended only once
    while True:
        said = api.call("sandboxes.output", {"sandboxId": sandbox_id, "pid": pid, **offsets},
                        tenant=tenant)
        for stream, err in (("stdout", False), ("stderr", True)):
            chunk = base64.b64decode(said[stream])
            if chunk:
                click.echo(chunk.decode(errors="replace"), nl=False, err=err)
        moved = (said["stdoutOffset"], said["stderrOffset"]) != tuple(offsets.values())
        offsets = {"stdoutOffset": said["stdoutOffset"], "stderrOffset": said["stderrOffset"]}
        if said["exited"] and ended is None:
            ended = said
        if ended is not None and not moved:
            return ended
        pause = 0.1 if moved else min(pause * 1.5, 1.0)
        time.sleep(pause)


@api_command(sandboxes, "pause", "sandboxes.pause")
@click.argument("sandbox_id")
def sandboxes_pause(sandbox_id: str) -> dict[str, Any]:
    """Stop a sandbox's vCPUs; its memory stays (metered at the pool's paused rate)."""
    return {"sandboxId": sandbox_id}


@api_command(sandboxes, "resume", "sandboxes.resume")
@click.argument("sandbox_id")
def sandboxes_resume(sandbox_id: str) -> dict[str, Any]:
    """Run a paused sandbox's vCPUs again."""
    return {"sandboxId": sandbox_id}


@api_command(sandboxes, "list", "sandboxes.list",
             columns=["id", "state", "nodeId", "vcpus", "memoryGiB", "startedAt"])
def sandboxes_list() -> dict[str, Any]:
    """Your sandboxes."""
    return {}


@api_command(sandboxes, "release", "sandboxes.release")
@click.argument("sandbox_id")
def sandboxes_release(sandbox_id: str) -> dict[str, Any]:
    """Stop the VM; its vCPUs and memory come back once the node stopped it."""
    return {"sandboxId": sandbox_id}


@click.group()
def series() -> None:
    """Recurring reservations (made with reserve --every)."""


@api_command(series, "list", "series.list",
             columns=["id", "poolId", "every", "timezone", "until", "occurrences", "endedAt"])
def series_list() -> dict[str, Any]:
    """The tenant's series."""
    return {}


@api_command(series, "get", "series.get")
@click.argument("series_id")
def series_get(series_id: str) -> dict[str, Any]:
    """One series: its rule, occurrences by state, and any the quota or limits refused."""
    return {"seriesId": series_id}


@api_command(series, "release", "series.release")
@click.argument("series_id")
def series_release(series_id: str) -> dict[str, Any]:
    """End a series: its occurrences that have not begun are cancelled."""
    return {"seriesId": series_id}


@click.group()
def usage() -> None:
    """Metered usage."""


@api_command(usage, "list", "usage.list",
             columns=["subject", "meter", "quantity", "windowStart", "windowEnd"])
@click.option("--meter", default=None, help="e.g. gpu.H100.hours")
@click.option("--subject", default=None, help="A reservation's or sandbox's id.")
def usage_list(meter: str | None, subject: str | None) -> dict[str, Any]:
    """Usage records, one per ended window."""
    return {"meter": meter, "subject": subject}


@api_command(usage, "budgets", "usage.budgets",
             columns=["poolId", "tenant", "gpuHours", "period", "priorityClass", "booked",
                      "used", "periodEnd"])
def usage_budgets() -> dict[str, Any]:
    """GPU-hour budgets in their current period: budget, booked (future too) and used."""
    return {}


REPORT_GROUPS = ["tenant", "pool", "meter", "day", "priorityClass"]


@usage.command("report")
@click.option("--from", "start", required=True, metavar="WHEN",
              help="From this moment: a date or an ISO time (UTC), e.g. 2026-12-01.")
@click.option("--to", "end", default=None, metavar="WHEN",
              help="Up to this moment, not included (default: now).")
@click.option("--group-by", default="meter", show_default=True,
              help=f"Comma-separated, from {', '.join(REPORT_GROUPS)} (day: UTC).")
@click.option("--csv", "as_csv", is_flag=True, help="Write the rows as CSV.")
@output_options
def usage_report(start: str, end: str | None, group_by: str, as_csv: bool,
                 output: str | None, query: str | None, tenant: str | None) -> None:
    """Usage between two moments, summed per group (the root tenant's: every tenant's)."""
    body = {"from": start, "to": end or datetime.now(UTC).isoformat(),
            "groupBy": group_by}
    result = make_client().call("usage.report", body, tenant=tenant)
    columns = [g for g in REPORT_GROUPS if g in result["groupBy"]] + ["quantity"]
    if as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows([row[c] or "" for c in columns] for row in result["rows"])
        return
    if output in (None, "table") and query is None:
        show(result["rows"], output=output, query=None, columns=columns)
        return
    show(result, output=output, query=query)


COMMANDS = [nodes, maintenance, capacity, reserve, reservations, series, release, extend,
            sandboxes, usage]
