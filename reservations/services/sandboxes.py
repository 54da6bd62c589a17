"""Sandboxes: VMs that claim vCPUs and memory from the nodes' guarded host counters."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F

from audit.services import audit_record, audited
from compute.db import database_now
from compute.errors import CapacityConflict, InvalidState
from compute.events.services import event_emit
from compute.events.types import EventType
from compute.idempotency import idempotent_lookup, idempotent_remember
from compute.tenancy.models import Principal, Tenant
from fleet.models import SCHEDULABLE, Node
from fleet.selectors import access_pool_by_id
from reservations.quotas import quota_consume, quota_refund
from reservations.sandboxes import Sandbox, SandboxState
from reservations.selectors import access_sandbox_by_id
from reservations.services.metering import usage_record
from reservations.work import pool_replan

MAX_RACES = 8


def _claim_host(pool_id: str, vcpus: int, memory_gib: int) -> Node | None:
    """The schedulable node that fits most tightly, with its counters already raised."""
    tried: set[str] = set()
    for _ in range(MAX_RACES):
        node = (Node.objects.filter(pool_id=pool_id).filter(SCHEDULABLE).exclude(pk__in=tried)
                .annotate(vcpus_free=F("vcpus") - F("vcpus_allocated"),
                          memory_free=F("memory_gib") - F("memory_gib_allocated"))
                .filter(vcpus_free__gte=vcpus, memory_free__gte=memory_gib)
                .order_by("vcpus_free", "memory_free", "id").first())
        if node is None:
            return None
        try:
            with transaction.atomic():
                Node.objects.filter(pk=node.pk).update(
                    vcpus_allocated=F("vcpus_allocated") + vcpus,
                    memory_gib_allocated=F("memory_gib_allocated") + memory_gib)
        except IntegrityError:  # the CHECK: another booker took the room meanwhile
            tried.add(node.pk)
            continue
        return node
    return None


@audited
def sandbox_create(*, tenant: Tenant, actor: Principal, pool_id: str, vcpus: int,
                   memory_gib: int, name: str = "", idempotency_key: str | None = None
                   ) -> Sandbox:
    """Start a sandbox VM's claim: `vcpus` and `memory_gib` on one node of the pool.

    The same host counters carry GPU reservations' host share, so neither can take what
    the other holds. Quota resources are `vcpu` and `memory` (GiB).
    """
    inputs = {"pool_id": pool_id, "vcpus": vcpus, "memory_gib": memory_gib, "name": name}
    existing = idempotent_lookup(tenant_id=tenant.id, scope="sandboxes.create",
                                 key=idempotency_key, inputs=inputs)
    if existing:
        return Sandbox.objects.get(pk=existing)
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id)
    quota_consume(tenant=tenant, pool=pool, resource="vcpu", amount=vcpus)
    quota_consume(tenant=tenant, pool=pool, resource="memory", amount=memory_gib)
    node = _claim_host(pool.id, vcpus, memory_gib)
    if node is None:
        raise CapacityConflict(
            f"no schedulable node of pool {pool.id} has {vcpus} vCPUs and {memory_gib} GiB free",
            vcpus=vcpus, memoryGiB=memory_gib)
    sandbox = Sandbox.objects.create(tenant=tenant, pool=pool, node=node, name=name,
                                     vcpus=vcpus, memory_gib=memory_gib,
                                     created_at=database_now())
    idempotent_remember(tenant_id=tenant.id, scope="sandboxes.create", key=idempotency_key,
                        inputs=inputs, object_id=sandbox.id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="sandbox.create",
                 target=sandbox.id, data={"nodeId": node.id, "vcpus": vcpus,
                                          "memoryGiB": memory_gib})
    event_emit(tenant_id=tenant.id, type=EventType.SANDBOX_CREATED, subject=sandbox.id,
               payload={"poolId": pool.id, "nodeId": node.id, "vcpus": vcpus,
                        "memoryGiB": memory_gib})
    return sandbox


@audited
def sandbox_release(*, tenant: Tenant, actor: Principal, sandbox_id: str) -> Sandbox:
    """Give back a sandbox's vCPUs and memory, and meter its vCPU hours."""
    sandbox = access_sandbox_by_id(tenant=tenant, sandbox_id=sandbox_id, lock=True)
    if sandbox.state != SandboxState.RUNNING:
        raise InvalidState(f"sandbox {sandbox.id} is {sandbox.state}", state=sandbox.state)
    now = database_now()
    quota_refund(tenant_id=tenant.id, pool=sandbox.pool, resource="vcpu", amount=sandbox.vcpus)
    quota_refund(tenant_id=tenant.id, pool=sandbox.pool, resource="memory",
                 amount=sandbox.memory_gib)
    Node.objects.filter(pk=sandbox.node_id).update(
        vcpus_allocated=F("vcpus_allocated") - sandbox.vcpus,
        memory_gib_allocated=F("memory_gib_allocated") - sandbox.memory_gib)
    sandbox.state = SandboxState.RELEASED
    sandbox.released_at = now
    sandbox.save(update_fields=["state", "released_at"])
    usage_record(tenant_id=tenant.id, subject=sandbox.id, meter="vcpu.hours",
                 units=sandbox.vcpus, start=sandbox.created_at, end=now)
    pool_replan(sandbox.pool_id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="sandbox.release",
                 target=sandbox.id)
    event_emit(tenant_id=tenant.id, type=EventType.SANDBOX_RELEASED, subject=sandbox.id,
               payload={"poolId": sandbox.pool_id, "nodeId": sandbox.node_id})
    return sandbox
