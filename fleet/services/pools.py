from __future__ import annotations

from typing import Any

from audit.services import audit_record, audited
from compute.core.errors import InvalidArgument
from compute.platform.events.services import event_emit
from compute.platform.idempotency import idempotent_lookup, idempotent_remember
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.models import Node, Pool, PoolClass
from fleet.selectors import access_pool_by_id, access_site_by_id
from fleet.services.specs import node_spec_change_locked


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


@audited
def pool_policy_update(*, tenant: Tenant, actor: Principal, pool_id: str,
                       policy: dict[str, Any]) -> Pool:
    """Replace the pool's policy. Its nodes get the next spec generation, which carries the
    new profile of units; bookings, acceptance and sandboxes follow the new policy from now
    on (what is booked stays booked)."""
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id, owned=True, lock=True)
    if pool.pool_class == PoolClass.CPU_HOST and policy.get("slurm"):
        raise InvalidArgument("slurm: a cpu-host pool holds no GPUs to publish", field="slurm")
    before = pool.policy or {}
    pool.policy = policy
    pool.save(update_fields=["policy"])
    respecified = 0
    for node in Node.objects.select_for_update(no_key=True).filter(pool=pool).order_by("pk"):
        if node.specs.exists():  # adopted once: it converges to specs
            node_spec_change_locked(node)
            respecified += 1
    changed = sorted(k for k in {*before, *policy} if before.get(k) != policy.get(k))
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="pool.policy.update",
                 target=pool.id, data={"changed": changed, "nodes": respecified})
    event_emit(tenant_id=tenant.id, type=FleetEvent.POOL_POLICY_UPDATED, subject=pool.id,
               payload={"changed": changed, "nodes": respecified})
    return pool
