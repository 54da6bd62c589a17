"""Commands over the API's objects: tenants, tokens, sites, pools, offerings, events."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from compute.cli.common import api_command, output_options, read_json_file, show
from compute.cli.common import client as make_client
from compute.cli.durations import Duration


@click.group()
def system() -> None:
    """The API itself."""


@api_command(system, "whoami", "system.whoami")
def whoami() -> dict[str, Any]:
    """Who the token belongs to, the tenant and the roles."""
    return {}


@click.group()
def tenants() -> None:
    """Customer tenants (created by root administrators)."""


@api_command(tenants, "create", "tenants.create")
@click.option("--slug", required=True, help="Short unique name, e.g. acme.")
@click.option("--name", default=None, help="Display name.")
@click.option("--key", default=None, help="Idempotency key: the same key returns the same tenant.")
def tenants_create(slug: str, name: str | None, key: str | None) -> dict[str, Any]:
    """Create a customer tenant."""
    return {"slug": slug, "name": name, "idempotencyKey": key}


@api_command(tenants, "get", "tenants.get")
def tenants_get() -> dict[str, Any]:
    """The acting tenant (see --tenant)."""
    return {}


@api_command(tenants, "list", "tenants.list", columns=["id", "slug", "name", "createdAt"])
def tenants_list() -> dict[str, Any]:
    """Tenants you can see."""
    return {}


@click.group()
def tokens() -> None:
    """API tokens (biam_…)."""


@tokens.command("create")
@click.option("--name", required=True)
@click.option("--role", type=click.Choice(["admin", "operator", "member", "viewer"]),
              default="member", show_default=True)
@click.option("--ttl", type=Duration(), default=None, help="Lifetime such as 30d; none if absent.")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write the token to this new file (mode 0600) instead of printing it.")
@output_options
def tokens_create(name: str, role: str, ttl: int | None, out: str | None, output: str | None,
                  query: str | None, tenant: str | None) -> None:
    """Mint an API token for a new service principal. The token is shown once."""
    with secret_file(out) as write:
        result = make_client().call("tokens.create", {"name": name, "role": role, "ttl": ttl},
                                    tenant=tenant)
        if out:
            write(result.pop("token"))
            click.echo(f"token written to {out}", err=True)
    show(result, output=output, query=query)


@contextmanager
def secret_file(path: str | None) -> Iterator[Callable[[str], None]]:
    """Claim `path` as a new 0600 file *before* anything is minted (an existing file is
    never overwritten, and then nothing is minted); yields the writer of the secret. If
    the block fails, the empty file is removed."""
    if path is None:
        yield lambda secret: None
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise click.BadParameter(f"{path} exists; it is never overwritten",
                                 param_hint="--out") from None
    written = False
    with os.fdopen(fd, "w") as handle:
        def write(secret: str) -> None:
            nonlocal written
            handle.write(secret + "\n")
            written = True

        try:
            yield write
        finally:
            if not written:
                os.unlink(path)


@api_command(tokens, "list", "tokens.list",
             columns=["id", "name", "principalId", "expiresAt", "revokedAt"])
def tokens_list() -> dict[str, Any]:
    """Tokens of the tenant (never their secrets)."""
    return {}


@api_command(tokens, "revoke", "tokens.revoke")
@click.argument("token_id")
def tokens_revoke(token_id: str) -> dict[str, Any]:
    """Revoke a token."""
    return {"tokenId": token_id}


@click.group()
def sites() -> None:
    """Sites: where machines live."""


@api_command(sites, "create", "sites.create")
@click.option("--kind", type=click.Choice(["shared", "dedicated"]), required=True)
@click.option("--region", required=True)
@click.option("--name", default=None)
@click.option("--key", default=None, help="Idempotency key: the same key returns the same site.")
def sites_create(kind: str, region: str, name: str | None, key: str | None) -> dict[str, Any]:
    """Create a platform site (root tenant)."""
    return {"kind": kind, "region": region, "name": name, "idempotencyKey": key}


@api_command(sites, "get", "sites.get")
@click.argument("site_id")
def sites_get(site_id: str) -> dict[str, Any]:
    """One site."""
    return {"siteId": site_id}


@api_command(sites, "list", "sites.list", columns=["id", "kind", "region", "name", "createdAt"])
def sites_list() -> dict[str, Any]:
    """Sites of the tenant."""
    return {}


@click.group()
def pools() -> None:
    """Pools: machines of one GPU model under one policy."""


@api_command(pools, "create", "pools.create")
@click.option("--site", "site_id", required=True)
@click.option("--class", "pool_class", type=click.Choice(["metal-host", "cpu-host"]),
              required=True)
@click.option("--gpu-model", default=None, help="GPU family such as H100.")
@click.option("--policy-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="JSON policy: acceptance checks, expect.gpuCount, hostShare, kubernetes, "
                   "slurm, profile.")
@click.option("--name", default=None)
@click.option("--key", default=None, help="Idempotency key: the same key returns the same pool.")
def pools_create(site_id: str, pool_class: str, gpu_model: str | None, policy_file: str | None,
                 name: str | None, key: str | None) -> dict[str, Any]:
    """Create a pool."""
    policy = read_json_file(policy_file) if policy_file else None
    return {"siteId": site_id, "class": pool_class, "gpuModel": gpu_model, "policy": policy,
            "name": name, "idempotencyKey": key}


@api_command(pools, "update", "pools.update")
@click.argument("pool_id")
@click.option("--policy-file", type=click.Path(exists=True, dir_okay=False), required=True,
              help="The whole new policy, JSON (what it leaves out is no longer set).")
def pools_update(pool_id: str, policy_file: str) -> dict[str, Any]:
    """Replace a pool's policy; its nodes converge to its profile of units."""
    return {"poolId": pool_id, "policy": read_json_file(policy_file)}


@api_command(pools, "get", "pools.get")
@click.argument("pool_id")
def pools_get(pool_id: str) -> dict[str, Any]:
    """One pool."""
    return {"poolId": pool_id}


@api_command(pools, "list", "pools.list", columns=["id", "name", "class", "gpuModel", "siteId"])
def pools_list() -> dict[str, Any]:
    """Pools you own or were offered."""
    return {}


def parse_quota(values: tuple[str, ...]) -> dict[str, int]:
    quota: dict[str, int] = {}
    for text in values:
        resource, sep, amount = text.partition("=")
        if not sep or not amount.isdigit():
            raise click.BadParameter(f"{text!r} is not resource=amount, e.g. gpu=16")
        quota[resource] = int(amount)
    return quota


@api_command(pools, "offer", "pools.offer")
@click.argument("pool_id")
@click.option("--to", "to", required=True, help="Tenant id or slug.")
@click.option("--quota", multiple=True, required=True, help="resource=amount, e.g. gpu=16.")
@click.option("--max-hours", type=click.FloatRange(0.01, 366 * 24), default=None,
              help="Limit: the longest reservation, in hours.")
@click.option("--max-ahead-days", type=click.FloatRange(0, 366), default=None,
              help="Limit: how far ahead a reservation may start, in days.")
@click.option("--max-gpus-at-once", type=click.IntRange(1), default=None,
              help="Limit: GPUs the tenant may hold at any one moment.")
@click.option("--idle-below", type=click.FloatRange(0.1, 100), default=None, metavar="PERCENT",
              help="Idle reclaim: GPU utilization under this is idle (with --idle-for).")
@click.option("--idle-for", type=click.FloatRange(0.1, 1440), default=None, metavar="MINUTES",
              help="Idle reclaim: flag a reservation idle this long (reservation.idle).")
@click.option("--idle-release", is_flag=True,
              help="Idle reclaim: release a flagged reservation still idle after the grace.")
@click.option("--idle-grace", type=click.FloatRange(0, 1440), default=None, metavar="MINUTES",
              help="Idle reclaim: minutes between the warning and the release (default 10).")
@click.option("--budget", "budgets", multiple=True, metavar="gpu-hours=N/PERIOD[:CLASS]",
              help="Limit: GPU-hours booked per day, week or month (in the pool's time "
                   "zone), e.g. gpu-hours=1000/month or gpu-hours=200/week:high; repeatable.")
@click.option("--share", type=click.IntRange(1, 10_000), default=None,
              help="The tenant's fair-share weight on the pool (1 when offered).")
@click.option("--priority-classes", default=None, metavar="CLASSES",
              help="Priority classes the tenant may ask for, e.g. high,normal,preemptible "
                   "(normal,preemptible when offered).")
def pools_offer(pool_id: str, to: str, quota: tuple[str, ...], max_hours: float | None,
                max_ahead_days: float | None, max_gpus_at_once: int | None,
                idle_below: float | None, idle_for: float | None, idle_release: bool,
                idle_grace: float | None, budgets: tuple[str, ...], share: int | None,
                priority_classes: str | None) -> dict[str, Any]:
    """Offer a pool to a tenant with a quota and, optionally, limits against hoarding (any
    limit given replaces the offering's limits), a fair-share weight and priority classes."""
    body: dict[str, Any] = {"poolId": pool_id, "to": to, "quota": parse_quota(quota),
                            "share": share}
    if priority_classes is not None:
        body["priorityClasses"] = [c.strip() for c in priority_classes.split(",") if c.strip()]
    limits: dict[str, Any] = {key: value for key, value in (("maxDurationHours", max_hours),
                                            ("maxStartAheadDays", max_ahead_days),
                                            ("maxGpusAtOnce", max_gpus_at_once))
              if value is not None}
    if (idle_below is None) != (idle_for is None):
        raise click.UsageError("idle reclaim needs both --idle-below and --idle-for")
    if idle_below is not None:
        rule = {"belowPercent": idle_below, "forMinutes": idle_for, "release": idle_release}
        limits["idleReclaim"] = {**rule, **({"graceMinutes": idle_grace}
                                            if idle_grace is not None else {})}
    if budgets:
        limits["budgets"] = [parse_budget(text) for text in budgets]
    if limits:
        body["limits"] = limits
    return body


def parse_budget(text: str) -> dict[str, Any]:
    """`gpu-hours=1000/month` or `gpu-hours=200/week:high` as a budget."""
    resource, _, rest = text.partition("=")
    amount, _, period = rest.partition("/")
    period, _, priority_class = period.partition(":")
    try:
        hours = float(amount)
    except ValueError:
        hours = -1.0
    if resource != "gpu-hours" or hours <= 0 or period not in ("day", "week", "month"):
        raise click.BadParameter(f"{text!r}: expected gpu-hours=N/day|week|month[:CLASS]",
                                 param_hint="--budget")
    return {"gpuHours": hours, "period": period,
            **({"priorityClass": priority_class} if priority_class else {})}


@click.group()
def offerings() -> None:
    """Offerings of pools between tenants."""


@api_command(offerings, "list", "offerings.list",
             columns=["id", "poolId", "tenant", "quota", "limits", "updatedAt"])
def offerings_list() -> dict[str, Any]:
    """Offerings you made or received."""
    return {}


@click.group()
def events() -> None:
    """The event log (every state change)."""


@api_command(events, "list", "events.list", columns=["seq", "type", "subject", "createdAt"])
@click.option("--types", default=None, help="Comma-separated globs, e.g. 'node.*,pool.*'.")
@click.option("--since", type=int, default=None, help="Events after this sequence.")
@click.option("--subject", default=None, help="Only events about this object id.")
@click.option("--limit", type=int, default=None)
def events_list(types: str | None, since: int | None, subject: str | None,
                limit: int | None) -> dict[str, Any]:
    """Page through events, oldest first."""
    return {"types": types, "since": since, "subject": subject, "limit": limit}


@events.command("watch")
@click.option("--types", default=None, help="Comma-separated globs, e.g. 'node.*,reservation.*'.")
@click.option("--since", type=click.IntRange(0), default=None,
              help="Resume after this sequence (0 replays the history); default: from now.")
@click.option("--count", type=click.IntRange(1), default=None,
              help="Stop after this many events (for scripts); default: follow until Ctrl-C.")
@click.option("--output", "-o", "output", type=click.Choice(["json", "table"]), default=None,
              help="table: a row per event (the default on a terminal); json: a JSON line "
              "per event (the default otherwise).")
@click.option("--tenant", default=None)
def events_watch(types: str | None, since: int | None, count: int | None, output: str | None,
                 tenant: str | None) -> None:
    """Follow events live from now, a line each; Ctrl-C stops. Resume with --since SEQ."""
    import sys

    import httpx

    from compute.cli.client import ApiError, CliError

    api = make_client()
    params = {k: v for k, v in {"types": types, "since": since,
                                "tenantId": tenant or api.config.tenant}.items()
              if v or (k == "since" and v is not None)}
    human = output == "table" or (output is None and sys.stdout.isatty())
    try:
        with api.http.stream("GET", f"{api.config.url}/events/watch", params=params,
                             timeout=httpx.Timeout(30, read=None)) as response:
            if response.status_code != 200:
                error = json.loads(response.read()).get("error", {})
                raise ApiError(error.get("code", "internal"), error.get("message", ""),
                               response.status_code, error.get("details") or {})
            for line in response.iter_lines():
                if not line.strip():
                    continue  # keep-alive
                if human:
                    event = json.loads(line)
                    click.echo(f"{event['seq']:>8}  {event['type']:<28} {event['subject']}  "
                               f"{event['createdAt']}")
                else:
                    click.echo(line)
                if count is not None:
                    count -= 1
                    if count == 0:
                        return
    except httpx.HTTPError as error:
        raise CliError(f"the watch stream broke: {error}") from error


GROUPS = [system, tenants, tokens, sites, pools, offerings, events]


@click.group("join-tokens")
def join_tokens() -> None:
    """Join tokens that let machines join a pool."""


@join_tokens.command("create")
@click.option("--pool", "pool_id", required=True)
@click.option("--ttl", type=Duration(minimum="1m", maximum="24h"), required=True,
              help="1m to 24h, e.g. 2h.")
@click.option("--max-uses", type=click.IntRange(1, 10_000), default=1, show_default=True)
@click.option("--expect-serial", default=None, help="Bind to the machine's serial.")
@click.option("--expect-product-uuid", default=None, help="Bind to its product UUID.")
@click.option("--expect-mac", default=None, help="Bind to one of its MAC addresses.")
@click.option("--role", type=click.Choice(["node", "provisioner"]), default="node",
              show_default=True, help="provisioner: the machine runs `bcd node "
              "--provisioner`, speaking Redfish to its site's BMCs.")
@click.option("--key", default=None, help="Idempotency key: a retry returns the same token "
              "(without its secret).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write the token to this new file (mode 0600) instead of the terminal.")
@output_options
def join_tokens_create(pool_id: str, ttl: int, max_uses: int, expect_serial: str | None,
                       expect_product_uuid: str | None, expect_mac: str | None,
                       role: str, key: str | None, out: str | None, output: str | None,
                       query: str | None, tenant: str | None) -> None:
    """Mint a join token; the control plane keeps only a hash of its secret."""
    with secret_file(out) as write:
        result = make_client().call("joinTokens.create", {
            "poolId": pool_id, "ttl": ttl, "maxUses": max_uses, "expectSerial": expect_serial,
            "expectProductUuid": expect_product_uuid, "expectMac": expect_mac,
            "role": role, "idempotencyKey": key}, tenant=tenant)
        if out:
            secret = result.pop("token")
            if secret is None:
                raise click.UsageError("this key was used before: the token was shown then "
                                       "and cannot be shown again")
            write(secret)
            click.echo(f"join token written to {out}", err=True)
    show(result, output=output, query=query)


@api_command(join_tokens, "list", "joinTokens.list",
             columns=["id", "poolId", "uses", "maxUses", "expiresAt", "revokedAt"])
def join_tokens_list() -> dict[str, Any]:
    """Join tokens (never their secrets)."""
    return {}


@api_command(join_tokens, "revoke", "joinTokens.revoke")
@click.argument("join_token_id")
def join_tokens_revoke(join_token_id: str) -> dict[str, Any]:
    """Revoke a join token."""
    return {"joinTokenId": join_token_id}


@click.group()
def pki() -> None:
    """The fleet PKI."""


@api_command(pki, "show", "pki.show")
def pki_show() -> dict[str, Any]:
    """The pins: servingCaSpkiPin, joinSigningKeyPin, joinEncryptionKeyPin."""
    return {}


GROUPS += [join_tokens, pki]
