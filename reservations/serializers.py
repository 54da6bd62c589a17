from __future__ import annotations

from typing import Any

from reservations.offerings import Offering


def present_offering(offering: Offering) -> dict[str, Any]:
    return {"id": offering.id, "poolId": offering.pool_id, "tenantId": offering.tenant_id,
            "tenant": offering.tenant.slug,
            "quota": {q.resource: {"limit": q.limit, "used": q.used}
                      for q in offering.quotas.all()},
            "createdAt": offering.created_at, "updatedAt": offering.updated_at}
