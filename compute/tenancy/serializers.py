"""Wire shapes (camelCase) of tenants and tokens."""

from __future__ import annotations

from typing import Any

from compute.tenancy.models import ApiToken, Tenant


def present_tenant(tenant: Tenant) -> dict[str, Any]:
    return {"id": tenant.id, "slug": tenant.slug, "name": tenant.name,
            "parentId": tenant.parent_id, "createdAt": tenant.created_at}


def present_token(token: ApiToken) -> dict[str, Any]:
    return {"id": token.id, "name": token.name, "principalId": token.principal_id,
            "createdAt": token.created_at, "expiresAt": token.expires_at,
            "revokedAt": token.revoked_at}
