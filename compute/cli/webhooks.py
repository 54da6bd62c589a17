"""`webhooks`: subscribe URLs to the tenant's events, read the delivery log, replay."""

from __future__ import annotations

from typing import Any

import click

from compute.cli.common import api_command


@click.group()
def webhooks() -> None:
    """Webhooks: the tenant's events POSTed to a URL, signed (Standard Webhooks)."""


@api_command(webhooks, "create", "webhooks.create")
@click.option("--url", required=True, help="Where to POST each event.")
@click.option("--types", default="*", show_default=True,
              help="Comma-separated event types or globs, e.g. 'reservation.*,node.*'.")
@click.option("--description", default=None)
@click.option("--max-attempts", type=int, default=None,
              help="Attempts of one delivery before it is dead-lettered (default 8).")
def webhooks_create(url: str, types: str, description: str | None,
                    max_attempts: int | None) -> dict[str, Any]:
    """Subscribe a URL; prints its signing secret, this once."""
    return {"url": url, "types": types, "description": description,
            "maxAttempts": max_attempts}


@api_command(webhooks, "list", "webhooks.list", columns=["id", "url", "types", "createdAt"])
def webhooks_list() -> dict[str, Any]:
    """The tenant's subscriptions."""
    return {}


@api_command(webhooks, "get", "webhooks.get")
@click.argument("webhook_id")
def webhooks_get(webhook_id: str) -> dict[str, Any]:
    """One subscription (never its secret)."""
    return {"webhookId": webhook_id}


@api_command(webhooks, "delete", "webhooks.delete")
@click.argument("webhook_id")
def webhooks_delete(webhook_id: str) -> dict[str, Any]:
    """Stop delivering and delete the subscription with its log."""
    return {"webhookId": webhook_id}


@api_command(webhooks, "deliveries", "webhooks.deliveries",
             columns=["id", "seq", "eventType", "state", "attempts", "lastStatus",
                      "lastError"])
@click.argument("webhook_id")
@click.option("--state", type=click.Choice(["pending", "delivered", "dead"]), default=None)
def webhooks_deliveries(webhook_id: str, state: str | None) -> dict[str, Any]:
    """The delivery log, newest first."""
    return {"webhookId": webhook_id, "state": state}


@api_command(webhooks, "replay", "webhooks.replay")
@click.argument("webhook_id")
@click.option("--delivery", "delivery_id", default=None, help="Send this delivery again.")
@click.option("--since", type=int, default=None,
              help="Send again every delivery of an event after this sequence.")
def webhooks_replay(webhook_id: str, delivery_id: str | None, since: int | None
                    ) -> dict[str, Any]:
    """Send deliveries again, in order, before anything newer."""
    if (delivery_id is None) == (since is None):
        raise click.UsageError("give --delivery or --since")
    return {"webhookId": webhook_id, "deliveryId": delivery_id, "since": since}
