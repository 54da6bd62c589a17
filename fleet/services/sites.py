from __future__ import annotations

from audit.services import audit_record, audited
from compute.core.errors import PermissionDenied
from compute.platform.events.services import event_emit
from compute.platform.idempotency import idempotent_lookup, idempotent_remember
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.models import Site


@audited
def site_create(*, tenant: Tenant, actor: Principal, kind: str, region: str, name: str = "",
                idempotency_key: str | None = None) -> Site:
    """Create a platform site. Only the root tenant owns platform sites."""
    if not tenant.is_root:
        raise PermissionDenied("only the root tenant creates platform sites", kind=kind)
    inputs = {"kind": kind, "region": region, "name": name}
    existing = idempotent_lookup(tenant_id=tenant.id, scope="sites.create",
                                 key=idempotency_key, inputs=inputs)
    if existing:
        return Site.objects.get(pk=existing)
    site = Site.objects.create(tenant=tenant, kind=kind, region=region,
                               name=name or idempotency_key or region)
    idempotent_remember(tenant_id=tenant.id, scope="sites.create", key=idempotency_key,
                        inputs=inputs, object_id=site.id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="site.create", target=site.id,
                 data=inputs)
    event_emit(tenant_id=tenant.id, type=FleetEvent.SITE_CREATED, subject=site.id,
               payload={"kind": kind, "region": region})
    return site
