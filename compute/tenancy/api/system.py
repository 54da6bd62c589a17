"""API method system.whoami."""

from __future__ import annotations

from typing import Any

from compute.api.inputs import Input
from compute.api.registry import CallContext, endpoint
from compute.tenancy.selectors import principal_roles


class WhoamiIn(Input):
    pass


@endpoint("system", "whoami", input=WhoamiIn, mutating=False)
def system_whoami(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Who the caller is, its tenant and its roles."""
    return {"principalId": ctx.principal.id, "name": ctx.principal.name,
            "tenantId": ctx.tenant.id, "tenant": ctx.tenant.slug,
            "homeTenantId": ctx.principal.tenant_id,
            "roles": principal_roles(ctx.principal)}
