"""Quota accounting inside the caller's transaction.

The pool's owner has no quota rows: its use is unlimited. Anyone else holds only what its
offering's quota allows; the row is locked first (the ledger's lock order: quota row, then
nodes by id, then devices by id), and its CHECK constraint is the backstop.
"""

from __future__ import annotations

from compute.core.errors import QuotaExceeded
from compute.platform.tenancy.models import Tenant
from fleet.models import Pool
from reservations.models import Quota


def quota_allows(*, tenant: Tenant, pool: Pool, resource: str, count: int) -> bool:
    """Whether `quota_consume` would take `count` now (a read, no lock)."""
    if pool.tenant_id == tenant.id or count == 0:
        return True
    row = Quota.objects.filter(tenant=tenant, pool=pool, resource=resource).first()
    return row is not None and row.used + count <= row.limit


def quota_consume(*, tenant: Tenant, pool: Pool, resource: str, count: int) -> None:
    if pool.tenant_id == tenant.id or count == 0:
        return
    row = Quota.objects.select_for_update(no_key=True).filter(tenant=tenant, pool=pool,
                                                   resource=resource).first()
    if row is None:
        raise QuotaExceeded(f"tenant {tenant.slug} has no {resource} quota on pool {pool.id}",
                            resource=resource, limit=0, used=0, requested=count)
    if row.used + count > row.limit:
        raise QuotaExceeded(
            f"{resource} quota on pool {pool.id} exceeded: {row.used} in use + {count} "
            f"requested > limit {row.limit}",
            resource=resource, limit=row.limit, used=row.used, requested=count)
    row.used += count
    row.save(update_fields=["used"])


def quota_refund(*, tenant_id: str, pool: Pool, resource: str, count: int) -> None:
    if pool.tenant_id == tenant_id or count == 0:
        return
    row = Quota.objects.select_for_update(no_key=True).filter(tenant_id=tenant_id, pool=pool,
                                                   resource=resource).first()
    if row is not None:
        row.used = max(0, row.used - count)
        row.save(update_fields=["used"])
