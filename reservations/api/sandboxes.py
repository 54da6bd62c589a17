"""API methods sandboxes.*."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.core.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.core.api.registry import CallContext, Subject, endpoint
from compute.core.api.shapes import STRING, array, nullable, obj, page_of
from compute.core.errors import InvalidState
from compute.platform.paging import page
from fleet.api.pools import pool_subject
from fleet.services.ask import node_ask
from reservations import presenters as wire
from reservations import selectors
from reservations.events import ReservationEvent
from reservations.models.sandboxes import LIVE
from reservations.presenters import present_sandbox
from reservations.services.sandboxes import sandbox_create, sandbox_release

SANDBOX = Subject("sandbox", selectors.access_sandbox_by_id, "sandbox_id")


class ForwardIn(Input):
    host_port = serializers.IntegerField(min_value=1024, max_value=65535)
    guest_port = serializers.IntegerField(min_value=1, max_value=65535)


class SandboxCreateIn(Input):
    pool_id = PublicIdField("pool")
    vcpus = serializers.IntegerField(min_value=1, max_value=256)
    memory_gi_b = serializers.IntegerField(min_value=1, max_value=4096)
    image = serializers.CharField(required=False, max_length=63, min_length=1,
                                  help_text="An image id or name of the pool (default: its "
                                            "image named default, or its only image).")
    forwards = ForwardIn(many=True, required=False, max_length=16,  # type: ignore[call-arg]
                         help_text="TCP ports of the node forwarded to the guest (on loopback "
                                   "unless the pool's policy says publicForwards).")
    name = serializers.CharField(required=False, default="", max_length=200, allow_blank=True)
    idempotency_key = IdempotencyKeyField()


CONSOLE = obj(sandboxId=STRING, nodeId=nullable(STRING), lines=array(STRING))


@endpoint("sandboxes", "create", returns=wire.SANDBOX, input=SandboxCreateIn, mutating=True,
          subject=pool_subject("sandbox"),
          emits=(ReservationEvent.SANDBOX_CREATED,))
def sandboxes_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Claim vCPUs and memory on one node of a pool and start a sandbox VM there."""
    data["memory_gib"] = data.pop("memory_gi_b")
    data["forwards"] = [ForwardIn.wire_form(f) for f in data.get("forwards", [])]
    return present_sandbox(sandbox_create(tenant=ctx.tenant, actor=ctx.principal, **data))


class SandboxIdIn(Input):
    sandbox_id = PublicIdField("sbx")


@endpoint("sandboxes", "get", returns=wire.SANDBOX,
          input=SandboxIdIn, mutating=False, subject=SANDBOX)
def sandboxes_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One sandbox."""
    return present_sandbox(ctx.subject)


@endpoint("sandboxes", "list", returns=page_of(wire.SANDBOX), input=ListInput, mutating=False)
def sandboxes_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sandboxes of the tenant."""
    return page(selectors.sandbox_list(tenant=ctx.tenant), present=present_sandbox, **data)


@endpoint("sandboxes", "release", returns=wire.SANDBOX,
          input=SandboxIdIn, mutating=True, subject=SANDBOX,
          emits=(ReservationEvent.SANDBOX_RELEASED,))
def sandboxes_release(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Stop a sandbox's VM; its vCPUs and memory come back once the node stopped it."""
    return present_sandbox(sandbox_release(tenant=ctx.tenant, actor=ctx.principal,
                                           sandbox_id=ctx.subject.id))


class SandboxLogsIn(SandboxIdIn):
    lines = serializers.IntegerField(required=False, default=50, min_value=1, max_value=2000)


@endpoint("sandboxes", "logs", returns=CONSOLE,
          input=SandboxLogsIn, mutating=False, subject=SANDBOX)
def sandboxes_logs(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """The last lines of a sandbox VM's serial console, read from its node."""
    sandbox = ctx.subject
    if sandbox.state not in LIVE:
        raise InvalidState(f"sandbox {sandbox.id} is {sandbox.state}: its console is gone",
                           state=sandbox.state)
    said = node_ask(node_id=sandbox.node_id, kind="vm.console",
                    payload={"sandboxId": sandbox.id, "lines": data["lines"]})
    lines = said.get("lines")
    return {"sandboxId": sandbox.id, "nodeId": sandbox.node_id,
            "lines": [str(line) for line in lines] if isinstance(lines, list) else []}
