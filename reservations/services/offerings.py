from __future__ import annotations

from typing import Any

from django.utils import timezone

from audit.services import audit_record, audited
from compute.core.errors import InvalidArgument, InvalidState
from compute.platform.events.services import event_emit
from compute.platform.tenancy.models import Principal, Tenant
from fleet.models import PoolClass
from fleet.selectors import access_pool_by_id
from reservations.events import ReservationEvent
from reservations.models.offerings import GPU_RESOURCES, HOST_RESOURCES, Offering, Quota
from reservations.sharing import check_granted


def allowed_resources(pool_class: str) -> tuple[str, ...]:
    return HOST_RESOURCES if pool_class == PoolClass.CPU_HOST else GPU_RESOURCES


@audited
def pool_offer(*, tenant: Tenant, actor: Principal, pool_id: str, to: Tenant,
               quota: dict[str, int], limits: dict[str, Any] | None = None,
               share: int | None = None,
               priority_classes: list[str] | None = None) -> Offering:
    """Offer an owned pool to another tenant with quotas, or change an offering's quotas;
    `limits` (against hoarding, see reservations.limits) replace the offering's when given.

    A GPU pool's quota resources are its atoms: `gpu` (whole GPUs), `mig` (MIG instances)
    and `gpu-share` (time-sliced shares); a CPU pool's are `vcpu` and `memory` (GiB).
    A limit below what the tenant already holds is refused. `share` (its fair-share
    weight) and `priority_classes` (those it may ask for) replace the offering's when given.
    """
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id, owned=True, lock=True)
    allowed = allowed_resources(pool.pool_class)
    unknown = sorted(set(quota) - set(allowed))
    if unknown:
        raise InvalidArgument(
            f"quota: {', '.join(unknown)} is not a resource of a {pool.pool_class} pool "
            f"(allowed: {', '.join(allowed)})", field="quota", allowed=list(allowed))
    if to.pk == tenant.pk:
        raise InvalidArgument("to: a pool's owner needs no offering", field="to")
    offering, created = Offering.objects.get_or_create(pool=pool, tenant=to)
    if not created:
        offering.updated_at = timezone.now()
    if limits is not None:
        offering.limits = limits
    if share is not None:
        offering.share = share
    if priority_classes is not None:
        check_granted(pool, priority_classes)
        offering.priority_classes = sorted(set(priority_classes))
    offering.save(update_fields=["updated_at", "limits", "share", "priority_classes"])
    for resource, limit in sorted(quota.items()):
        row, _ = Quota.objects.select_for_update(no_key=True).get_or_create(
            tenant=to, pool=pool, resource=resource,
            defaults={"offering": offering, "limit": limit})
        if row.used > limit:
            raise InvalidState(
                f"quota {resource}={limit} is below what {to.slug} holds now ({row.used})",
                resource=resource, used=row.used, limit=limit)
        row.limit = limit
        row.save(update_fields=["limit"])
    data = {"poolId": pool.id, "to": to.id, "quota": quota, "limits": offering.limits,
            "share": offering.share, "priorityClasses": offering.priority_classes}
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="pool.offer", target=pool.id,
                 data=data)
    event_emit(tenant_id=tenant.id, type=ReservationEvent.POOL_OFFERED, subject=pool.id,
               payload=data)
    event_emit(tenant_id=to.id, type=ReservationEvent.OFFERING_UPDATED, subject=offering.id,
               payload=data)
    return offering
