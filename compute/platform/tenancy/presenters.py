"""Wire shapes (camelCase) of tenants and tokens."""

from __future__ import annotations

from typing import Any

from compute.core.api.shapes import STRING, TIME, nullable, obj
from compute.platform.tenancy.models import ApiToken, Tenant

TENANT = obj(id=STRING, slug=STRING, name=STRING, parentId=nullable(STRING), createdAt=TIME)
TOKEN = obj(id=STRING, name=STRING, principalId=STRING, createdAt=TIME,
            expiresAt=nullable(TIME), revokedAt=nullable(TIME))


def present_tenant(tenant: Tenant) -> dict[str, Any]:
    return {"id": tenant.id, "slug": tenant.slug, "name": tenant.name,
            "parentId": tenant.parent_id, "createdAt": tenant.created_at}


def present_token(token: ApiToken) -> dict[str, Any]:
    return {"id": token.id, "name": token.name, "principalId": token.principal_id,
            "createdAt": token.created_at, "expiresAt": token.expires_at,
            "revokedAt": token.revoked_at}
