"""The method registry: every `POST /api/compute/<group>/<method>` is declared here.

A method names what it acts on: a `Subject` is loaded once, through its tenant-scoped
access selector, before IAM decides (it is the draft's resource) and handed to the handler
as `ctx.subject`; a method without one acts on the tenant as a whole (creates and lists).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compute.core.api.inputs import Input


@dataclass(frozen=True)
class Resource:
    """What a call would touch: its kind, its id (None for a create) and its tenant."""

    kind: str
    tenant_id: str
    id: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class CallContext:
    """One authenticated call: who, in which tenant, under which request id, on what."""

    principal: Any
    tenant: Any
    request_id: str
    subject: Any = None


Handler = Callable[[CallContext, dict[str, Any]], Any]
Draft = Callable[[CallContext, dict[str, Any]], Resource]


@dataclass(frozen=True)
class Subject:
    """The object a method acts on: `access(tenant=…, <param>=data[key], **options)`
    raises NotFound outside the caller's tenant, so existence never leaks."""

    kind: str
    access: Callable[..., Any]
    key: str
    param: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def load(self, ctx: CallContext, data: dict[str, Any]) -> Any:
        return self.access(tenant=ctx.tenant, **{self.param or self.key: data[self.key]},
                           **self.options)


@dataclass(frozen=True)
class Endpoint:
    group: str
    method: str
    handler: Handler
    input: type[Input]
    mutating: bool
    summary: str
    subject: Subject | None = None
    resource_kind: str = ""
    custom_draft: Draft | None = None
    emits: tuple[str, ...] = ()
    returns: dict[str, Any] = field(default_factory=dict)  # the result's OpenAPI schema

    @property
    def action(self) -> str:
        return f"{self.group}.{self.method}"

    @property
    def source(self) -> str:
        """Where the handler lives, as `path/to/module.py:function` (OpenAPI `x-handler`)."""
        path = inspect.getsourcefile(self.handler) or ""
        module_path = self.handler.__module__.replace(".", "/")
        tail = path[path.rfind(module_path):] if module_path in path else path
        return f"{tail}:{self.handler.__name__}"

    def draft(self, ctx: CallContext, data: dict[str, Any]) -> Resource:
        """Load the subject (into `ctx.subject`) and name the resource IAM decides on."""
        if self.custom_draft is not None:
            return self.custom_draft(ctx, data)
        if self.subject is not None:
            ctx.subject = self.subject.load(ctx, data)
            return Resource(kind=self.subject.kind, tenant_id=ctx.tenant.id,
                            id=str(ctx.subject.pk))
        return Resource(kind=self.resource_kind or self.group, tenant_id=ctx.tenant.id)


REGISTRY: dict[tuple[str, str], Endpoint] = {}


def endpoint(group: str, method: str, *, input: type[Input], mutating: bool,
             returns: dict[str, Any], subject: Subject | None = None,
             resource_kind: str = "", draft: Draft | None = None,
             emits: tuple[str, ...] = ()) -> Callable[[Handler], Handler]:
    """Register a handler. Its docstring's first paragraph is the method's summary. `draft`
    replaces the subject-or-tenant draft for the rare method that acts elsewhere; `returns`
    is the result's schema (compute.core.api.shapes). A
    mutating method names the event types a call may write (`emits`); every call that
    changes something writes exactly one audit row besides."""

    def register(handler: Handler) -> Handler:
        key = (group, method)
        if key in REGISTRY:
            raise RuntimeError(f"{group}.{method} is registered twice")
        REGISTRY[key] = Endpoint(
            group=group, method=method, handler=handler, input=input, mutating=mutating,
            subject=subject, resource_kind=resource_kind, custom_draft=draft,
            emits=tuple(str(e) for e in emits), returns=returns,
            summary=" ".join((handler.__doc__ or f"{group}.{method}").strip()
                             .split("\n\n")[0].split()))
        return handler

    return register
