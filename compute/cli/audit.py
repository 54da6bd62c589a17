"""`better-compute audit`: checkpoints, verification and inclusion proofs."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from bcd.contract.auditproof import check_proof
from compute.cli.client import CliError
from compute.cli.common import api_command, output_options, show
from compute.cli.common import client as make_client


@click.group()
def audit() -> None:
    """The provable audit trail."""


@api_command(audit, "checkpoint", "audit.checkpoint")
def audit_checkpoint() -> dict[str, Any]:
    """Sign a checkpoint over the tenant's new events now."""
    return {}


@click.command("list")
@click.option("--action", default=None, help="Such as node.join, or node.* for a prefix.")
@click.option("--allowed", type=click.Choice(["true", "false"]), default=None,
              help="false: only refusals (a refused join says why here).")
@click.option("--target", default=None, help="Only rows about this object id.")
@click.option("--since", type=click.IntRange(0), default=0, help="Rows after this position.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@output_options
def audit_list(action: str | None, allowed: str | None, target: str | None, since: int,
               limit: int, output: str | None, query: str | None, tenant: str | None) -> None:
    """Audit rows, oldest first: who did (or was refused) what, and why; ids for prove."""
    body = {"action": action, "allowed": None if allowed is None else allowed == "true",
            "target": target, "since": since, "limit": limit}
    result = make_client().call("audit.list", body, tenant=tenant)
    show(result, output=output, query=query,
         columns=["id", "position", "action", "allowed", "actorId", "target", "reason"])


@click.command("verify")
@click.option("--from", "from_position", type=click.IntRange(1), default=None)
@click.option("--to", "to_position", type=click.IntRange(1), default=None)
@output_options
def audit_verify(from_position: int | None, to_position: int | None, output: str | None,
                 query: str | None, tenant: str | None) -> None:
    """Recompute the log and its checkpoints; exit 1 naming the first bad position."""
    result = make_client().call("audit.verify", {"fromPosition": from_position,
                                                 "toPosition": to_position}, tenant=tenant)
    show(result, output=output, query=query)
    if not result["ok"]:
        raise CliError(f"audit log does not verify at position {result['firstBadPosition']}: "
                       f"{result['problem']}")


@click.command("prove")
@click.argument("event_id", metavar="AUDIT_EVENT_OR_OBJECT_ID")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the proof to this file.")
@output_options
def audit_prove(event_id: str, out: str | None, output: str | None, query: str | None,
                tenant: str | None) -> None:
    """An inclusion proof of one audit event (aud_…, or the latest about an object id),
    verifiable offline with check-proof."""
    result = make_client().call("audit.prove", {"eventId": event_id}, tenant=tenant)
    if out:
        with open(out, "w") as handle:
            json.dump(result, handle, indent=2)
        click.echo(f"proof written to {out}", err=True)
        return
    show(result, output=output or "json", query=query)


@click.command("check-proof")
@click.argument("proof_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--public-key", default=None, envvar="BETTER_COMPUTE_AUDIT_KEY",
              help="The audit signing key (base64), from /.well-known/better-compute.")
def audit_check_proof(proof_file: str, public_key: str | None) -> None:
    """Check a proof offline, with only the audit signing key: no server is contacted."""
    if not public_key:
        raise CliError("give --public-key (or BETTER_COMPUTE_AUDIT_KEY): the auditSigningKey "
                       "from /.well-known/better-compute, obtained out of band")
    try:
        with open(proof_file) as handle:
            document = json.load(handle)
    except (OSError, ValueError) as error:
        raise CliError(f"cannot read {os.path.basename(proof_file)}: {error}") from error
    ok, message = check_proof(document, public_key)
    if not ok:
        raise CliError(f"proof does NOT verify: {message}")
    click.echo(f"proof verifies: {message}")


@click.command("public-key")
def audit_public_key() -> None:
    """The audit signing key, as the control plane publishes it in its well-known document
    (for check-proof; a verifier should get it out of band and keep it)."""
    import httpx

    from compute.cli.client import Config

    base = Config.from_env().url.removesuffix("/").removesuffix("/api/compute")
    try:
        document = httpx.get(f"{base}/.well-known/better-compute", timeout=30).json()
    except (httpx.HTTPError, ValueError) as error:
        raise CliError(f"cannot read {base}/.well-known/better-compute: {error}") from error
    click.echo(document["auditSigningKey"]["publicKey"])


audit.add_command(audit_public_key)
audit.add_command(audit_list)
audit.add_command(audit_verify)
audit.add_command(audit_prove)
audit.add_command(audit_check_proof)
