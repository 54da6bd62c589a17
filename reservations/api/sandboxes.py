"""API methods sandboxes.*."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.api.inputs import IdempotencyKeyField, Input, ListInput, PublicIdField
from compute.api.registry import CallContext, Subject, endpoint
from compute.events.types import EventType
from compute.paging import page
from reservations import selectors
from reservations.api.pools import pool_subject
from reservations.serializers import present_sandbox
from reservations.services.sandboxes import sandbox_create, sandbox_release

SANDBOX = Subject("sandbox", selectors.access_sandbox_by_id, "sandbox_id")


class SandboxCreateIn(Input):
    pool_id = PublicIdField("pool")
    vcpus = serializers.IntegerField(min_value=1, max_value=1024)
    memory_gi_b = serializers.IntegerField(min_value=1, max_value=16384)
    name = serializers.CharField(required=False, default="", max_length=200, allow_blank=True)
    idempotency_key = IdempotencyKeyField()


@endpoint("sandboxes", "create", input=SandboxCreateIn, mutating=True,
          subject=pool_subject("sandbox"),
          emits=(EventType.SANDBOX_CREATED,))
def sandboxes_create(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Claim vCPUs and memory on one node of a pool for a sandbox VM."""
    data["memory_gib"] = data.pop("memory_gi_b")
    return present_sandbox(sandbox_create(tenant=ctx.tenant, actor=ctx.principal, **data))


class SandboxIdIn(Input):
    sandbox_id = PublicIdField("sbx")


@endpoint("sandboxes", "get", input=SandboxIdIn, mutating=False, subject=SANDBOX)
def sandboxes_get(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """One sandbox."""
    return present_sandbox(ctx.subject)


@endpoint("sandboxes", "list", input=ListInput, mutating=False)
def sandboxes_list(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sandboxes of the tenant."""
    return page(selectors.sandbox_list(tenant=ctx.tenant), present=present_sandbox, **data)


@endpoint("sandboxes", "release", input=SandboxIdIn, mutating=True, subject=SANDBOX,
          emits=(EventType.SANDBOX_RELEASED,))
def sandboxes_release(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Give back a sandbox's vCPUs and memory."""
    return present_sandbox(sandbox_release(tenant=ctx.tenant, actor=ctx.principal,
                                           sandbox_id=ctx.subject.id))
