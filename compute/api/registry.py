"""The method registry: every `POST /api/compute/<group>/<method>` is declared here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compute.api.inputs import Input
from compute.iam import Resource


@dataclass
class CallContext:
    """One authenticated call: who, in which tenant, under which request id."""

    principal: Any
    tenant: Any
    request_id: str


Handler = Callable[[CallContext, dict[str, Any]], Any]
Draft = Callable[[CallContext, dict[str, Any]], Resource]


@dataclass(frozen=True)
class Endpoint:
    group: str
    method: str
    handler: Handler
    input: type[Input]
    draft: Draft
    mutating: bool
    summary: str

    @property
    def action(self) -> str:
        return f"{self.group}.{self.method}"


REGISTRY: dict[tuple[str, str], Endpoint] = {}


def tenant_draft(kind: str) -> Draft:
    """The draft of a call that acts on the tenant as a whole (creates and lists)."""

    def draft(ctx: CallContext, data: dict[str, Any]) -> Resource:
        return Resource(kind=kind, tenant_id=ctx.tenant.id)

    return draft


def endpoint(group: str, method: str, *, input: type[Input],
             mutating: bool, draft: Draft | None = None) -> Callable[[Handler], Handler]:
    """Register a handler. Its docstring's first line is the method's summary."""

    def register(handler: Handler) -> Handler:
        key = (group, method)
        if key in REGISTRY:
            raise RuntimeError(f"{group}.{method} is registered twice")
        REGISTRY[key] = Endpoint(
            group=group, method=method, handler=handler, input=input,
            draft=draft or tenant_draft(group), mutating=mutating,
            summary=(handler.__doc__ or f"{group}.{method}").strip().splitlines()[0])
        return handler

    return register
