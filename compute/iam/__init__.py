"""The IAM seam: every API request is decided once, here, on its draft.

`decide(principal, action, resource, context)` is the only entry point. The backend is
chosen by `settings.BC_IAM_BACKEND`; the embedded one reads role bindings from Postgres,
and an external IAM service can replace it without touching any caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from bcd.contract import ids
from compute.api.registry import Resource


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
