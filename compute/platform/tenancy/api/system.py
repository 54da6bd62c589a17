"""API method system.whoami."""

from __future__ import annotations

from typing import Any

from compute.core.api.inputs import Input
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import STRING, array, obj
from compute.platform.tenancy.selectors import principal_roles


class WhoamiIn(Input):
    pass


WHOAMI = obj(principalId=STRING, name=STRING, tenantId=STRING, tenant=STRING,
             homeTenantId=STRING, roles=array(obj(tenantId=STRING, tenant=STRING, role=STRING)))


@endpoint("system", "whoami", returns=WHOAMI, input=WhoamiIn, mutating=False)
def system_whoami(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Who the caller is, its tenant and its roles."""
    return {"principalId": ctx.principal.id, "name": ctx.principal.name,
            "tenantId": ctx.tenant.id, "tenant": ctx.tenant.slug,
            "homeTenantId": ctx.principal.tenant_id,
            "roles": principal_roles(ctx.principal)}
