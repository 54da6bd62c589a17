"""A pool's image catalogue: what sandboxes boot. Nodes fetch each part by its URL and
accept it only if its sha256 matches."""

from __future__ import annotations

from audit.services import audit_record, audited
from compute.core.errors import AlreadyExists, InvalidState
from compute.platform.events.services import event_emit
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.models import Image
from fleet.selectors import access_image_by_id, access_pool_by_id


@audited
def image_create(*, tenant: Tenant, actor: Principal, pool_id: str, name: str,
                 kernel: dict[str, str], initrd: dict[str, str],
                 disk: dict[str, str] | None = None,
                 ready_line: str = "better-compute guest ready",
                 snapshot: bool = False) -> Image:
    """Add an image to a pool the tenant owns; its name is unique in the pool."""
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id, owned=True, lock=True)
    if Image.objects.filter(pool=pool, name=name).exists():
        raise AlreadyExists(f"pool {pool.id} already has an image named {name!r}", name=name)
    disk = disk or {}
    image = Image.objects.create(
        pool=pool, name=name, kernel_url=kernel["url"], kernel_sha256=kernel["sha256"],
        initrd_url=initrd["url"], initrd_sha256=initrd["sha256"],
        disk_url=disk.get("url", ""), disk_sha256=disk.get("sha256", ""),
        ready_line=ready_line, snapshot=snapshot)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="image.create",
                 target=image.id, data={"poolId": pool.id, "name": name, "snapshot": snapshot})
    event_emit(tenant_id=tenant.id, type=FleetEvent.IMAGE_CREATED, subject=image.id,
               payload={"poolId": pool.id, "name": name})
    return image


@audited
def image_delete(*, tenant: Tenant, actor: Principal, image_id: str) -> Image:
    """Remove an image no live sandbox boots from (past sandboxes keep their history)."""
    image = access_image_by_id(tenant=tenant, image_id=image_id, owned=True)
    live = list(image.sandboxes.filter(ended_at__isnull=True)
                .values_list("id", flat=True)[:1000])
    if live:
        raise InvalidState(f"image {image.id} is in use by {len(live)} sandbox(es), such "
                           f"as {live[0]}", state="in-use")
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="image.delete",
                 target=image.id, data={"poolId": image.pool_id, "name": image.name})
    event_emit(tenant_id=tenant.id, type=FleetEvent.IMAGE_DELETED, subject=image.id,
               payload={"poolId": image.pool_id, "name": image.name})
    Image.objects.filter(pk=image.pk).delete()  # `image.delete()` would clear its id
    return image
