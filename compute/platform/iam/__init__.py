"""The IAM seam: every API request is decided once, here, on its draft.

`decide(principal, action, resource, context)` asks the backend; `decide_or_refuse` is what
callers use: it also audits a refusal (limited per caller: compute.platform.iam.refusals) and stamps
an allowed call. The backend is
chosen by `settings.BC_IAM_BACKEND`; the embedded one reads role bindings from Postgres,
and an external IAM service can replace it without touching any caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from audit.context import CallStamp, stamped
from bcd.contract import ids
from compute.core.api.registry import Resource
from compute.core.errors import PermissionDenied
from compute.platform.iam.refusals import refusal_recorded


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    id: str = field(default_factory=lambda: ids.new("dec"))


class Authorizer(Protocol):
    def decide(self, principal: Any, action: str, resource: Resource,
               context: dict[str, Any]) -> Decision: ...


@cache
def _backend(path: str) -> Authorizer:
    return import_string(path)()


def authorizer() -> Authorizer:
    return _backend(settings.BC_IAM_BACKEND)


def decide(principal: Any, action: str, resource: Resource,
           context: dict[str, Any] | None = None) -> Decision:
    return authorizer().decide(principal, action, resource, context or {})


def decide_or_refuse(principal: Any, action: str, resource: Resource, *, tenant_id: str,
                     request_id: str, origin: str = "api") -> CallStamp:
    """One IAM decision for a caller acting in `tenant_id`. A refusal writes its denied audit
    row there and raises PermissionDenied; an allowed call gets the stamp its audit row will
    carry. Every entry point (the envelope, the watch stream, the console, the admin's
    actions) decides through here."""
    decision = decide(principal, action, resource,
                      {"requestId": request_id, "tenantId": tenant_id})
    stamp = CallStamp(request_id=request_id, decision_id=decision.id,
                      decision_reason=decision.reason, origin=origin)
    if not decision.allowed:
        with stamped(stamp):
            refusal_recorded(principal_id=principal.id, tenant_id=tenant_id, action=action,
                             target=resource.id or "", reason=decision.reason)
        raise PermissionDenied(f"not allowed: {decision.reason}", action=action,
                               decisionId=decision.id)
    return stamp
