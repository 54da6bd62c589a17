from __future__ import annotations

from typing import Any

from audit.services import audit_record, audited
from compute.core.errors import InvalidArgument
from compute.platform.events.services import event_emit
from compute.platform.idempotency import idempotent_lookup, idempotent_remember
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.models import Pool, PoolClass
from fleet.selectors import access_site_by_id


@audited
def pool_create(*, tenant: Tenant, actor: Principal, site_id: str, pool_class: str,
                gpu_model: str = "", policy: dict[str, Any] | None = None, name: str = "",
                idempotency_key: str | None = None) -> Pool:
    """Create a pool in one of the tenant's sites. A GPU pool names exactly one GPU model."""
    policy = policy or {}
    if pool_class == PoolClass.METAL_HOST and not gpu_model:
        raise InvalidArgument("gpuModel: a metal-host pool needs a GPU model", field="gpuModel")
    if pool_class == PoolClass.CPU_HOST and gpu_model:
        raise InvalidArgument("gpuModel: a cpu-host pool has no GPU model", field="gpuModel")
    inputs = {"site_id": site_id, "pool_class": pool_class, "gpu_model": gpu_model,
              "policy": policy, "name": name}
    existing = idempotent_lookup(tenant_id=tenant.id, scope="pools.create",
                                 key=idempotency_key, inputs=inputs)
    if existing:
        return Pool.objects.get(pk=existing)
    site = access_site_by_id(tenant=tenant, site_id=site_id)
    pool = Pool.objects.create(tenant=tenant, site=site, pool_class=pool_class,
                               gpu_model=gpu_model, policy=policy,
                               name=name or idempotency_key or "")
    idempotent_remember(tenant_id=tenant.id, scope="pools.create", key=idempotency_key,
                        inputs=inputs, object_id=pool.id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="pool.create", target=pool.id,
                 data={"siteId": site.id, "class": pool_class, "gpuModel": gpu_model})
    event_emit(tenant_id=tenant.id, type=FleetEvent.POOL_CREATED, subject=pool.id,
               payload={"siteId": site.id, "gpuModel": gpu_model})
    return pool
