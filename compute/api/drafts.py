"""Draft builders: the resource a call would touch, resolved before IAM decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compute.api.registry import CallContext, Draft
from compute.iam import Resource


def object_draft(kind: str, guard: Callable[[CallContext, str], Any], field: str) -> Draft:
    """The draft of a call on one object: `guard` raises NotFound outside the caller's tenant."""

    def draft(ctx: CallContext, data: dict[str, Any]) -> Resource:
        obj = guard(ctx, data[field])
        return Resource(kind=kind, tenant_id=ctx.tenant.id, id=str(obj.pk))

    return draft
