"""Sandboxes: VMs that claim vCPUs and memory from the nodes' guarded host counters.

Creating one claims the counters and puts the VM into its node's desired state; bcd starts
QEMU and reports (signed) when the guest has booted, which alone makes the sandbox
`running`. Releasing one takes the VM out of the desired state; the counters are given back
when the node reports it stopped (or that it failed or exited), never before, so a VM that
still runs is never counted as gone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q

from audit.services import audit_record, audited
from bcd.contract.vms import ImagePart, Vm
from compute.core.db import database_now
from compute.core.errors import CapacityConflict, InvalidArgument, InvalidState
from compute.platform.events.services import event_emit
from compute.platform.events.types import EventType
from compute.platform.idempotency import idempotent_lookup, idempotent_remember
from compute.platform.tenancy.models import Principal, Tenant
from fleet.models import SCHEDULABLE, Image, Node, Pool
from fleet.selectors import access_pool_by_id
from fleet.services.specs import node_spec_change_locked
from reservations.events import ReservationEvent
from reservations.models.sandboxes import LIVE, Sandbox, SandboxState
from reservations.quotas import quota_consume, quota_refund
from reservations.selectors import access_sandbox_by_id
from reservations.services.maintenance import in_maintenance
from reservations.services.metering import hourly, usage_record
from reservations.services.sandbox_use import expires_at_for, paused_rate
from reservations.work import pool_replan

MAX_RACES = 8


def _claim_host(pool_id: str, vcpus: int, memory_gib: int,
                host_ports: list[int]) -> Node | None:
    """The schedulable node that fits most tightly (and has none of `host_ports` forwarded
    already, and no maintenance window now), with its counters already raised."""
    tried: set[str] = set()
    taken = Q()
    for port in host_ports:
        taken |= Q(sandboxes__ended_at__isnull=True,  # still holds the node
                   sandboxes__forwards__contains=[{"hostPort": port}])
    for _ in range(MAX_RACES):
        now = database_now()
        candidates = (Node.objects.filter(pool_id=pool_id).filter(SCHEDULABLE)
                      .exclude(pk__in=tried).exclude(virtualization="none")
                      .exclude(in_maintenance(now)))
        if host_ports:
            candidates = candidates.exclude(pk__in=Node.objects.filter(taken).values("pk"))
        node = (candidates
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
                # With the node's row locked: a window committed since the look above wins.
                if Node.objects.filter(pk=node.pk).filter(in_maintenance(now)).exists():
                    raise IntegrityError("the node went into maintenance")
        except IntegrityError:  # the CHECK: another booker took the room meanwhile
            tried.add(node.pk)
            continue
        return node
    return None


def _bounded(pool: Pool, vcpus: int, memory_gib: int) -> dict[str, Any]:
    """The pool's sandbox policy, once the request is checked against its bounds."""
    policy = dict(pool.policy.get("sandboxes") or {})
    for field, asked, limit in (("vcpus", vcpus, policy.get("maxVcpus")),
                                ("memoryGiB", memory_gib, policy.get("maxMemoryGiB"))):
        if limit is not None and asked > limit:
            bound = "maxVcpus" if field == "vcpus" else "maxMemoryGiB"
            raise InvalidArgument(f"{field}: {asked} is above pool {pool.id}'s {bound} "
                                  f"({limit})", field=field, limit=limit)
    return policy


def _image_for(pool: Pool, ref: str | None, allowed: list[str] | None) -> Image:
    """The image named (by id or name) or the pool's default: the one named `default`,
    or its only image."""
    images = Image.objects.filter(pool=pool)
    if ref:
        image = images.filter(Q(pk=ref) | Q(name=ref)).first()
        if image is None:
            known = ", ".join(images.values_list("name", flat=True)) or "none"
            raise InvalidArgument(f"image: pool {pool.id} has no image {ref!r} (it has: "
                                  f"{known})", field="image")
    else:
        image = images.filter(name="default").first() or (
            images.first() if images.count() == 1 else None)
        if image is None:
            raise InvalidArgument(f"image: pool {pool.id} has {images.count()} images and "
                                  "none named default; name one (images list)", field="image")
    if allowed is not None and image.name not in allowed:
        raise InvalidArgument(f"image: pool {pool.id}'s policy allows only "
                              f"{', '.join(allowed) or 'no image'}", field="image")
    return image


def vm_of(sandbox: Sandbox, image: Image, *, listen: str) -> dict[str, Any]:
    """The VM as the node's spec carries it (checked by the same contract bcd checks)."""
    parts = image.parts()
    return Vm(sandbox.id, sandbox.vcpus, sandbox.memory_gib * 1024,
              ImagePart(**parts["kernel"]), ImagePart(**parts["initrd"]),
              ImagePart(**parts["disk"]) if "disk" in parts else None,
              ready_line=image.ready_line, listen=listen,
              forwards=tuple((f["hostPort"], f["guestPort"]) for f in sandbox.forwards),
              network=sandbox.network, snapshot=image.snapshot).wire()


def _network(pool: Pool, policy: dict[str, Any], asked: str | None,
             forwards: list[dict[str, int]]) -> str:
    """What the sandbox gets: none unless asked (port forwards ask for outbound), and
    outbound only where the pool's policy allows it."""
    network = asked or ("outbound" if forwards else "none")
    if forwards and network != "outbound":
        raise InvalidArgument("forwards: port forwards need network outbound", field="network")
    if network == "outbound" and policy.get("network", "none") != "outbound":
        raise InvalidArgument(f"network: pool {pool.id}'s policy gives sandboxes no network "
                              "(its sandboxes.network is none)", field="network")
    return network


@audited
def sandbox_create(*, tenant: Tenant, actor: Principal, pool_id: str, vcpus: int,
                   memory_gib: int, image: str | None = None,
                   forwards: list[dict[str, int]] | None = None, name: str = "",
                   network: str | None = None, timeout_seconds: int | None = None,
                   idempotency_key: str | None = None) -> Sandbox:
    """Claim `vcpus` and `memory_gib` on one node of the pool and put the VM into that
    node's desired state.

    The same host counters carry GPU reservations' host share, so neither can take what
    the other holds. Quota resources are `vcpu` and `memory` (GiB).
    """
    forwards = forwards or []
    inputs = {"pool_id": pool_id, "vcpus": vcpus, "memory_gib": memory_gib, "name": name,
              "image": image, "forwards": forwards, "network": network,
              "timeout_seconds": timeout_seconds}
    existing = idempotent_lookup(tenant_id=tenant.id, scope="sandboxes.create",
                                 key=idempotency_key, inputs=inputs)
    if existing:
        return Sandbox.objects.get(pk=existing)
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id)
    policy = _bounded(pool, vcpus, memory_gib)
    chosen = _image_for(pool, image, policy.get("images"))
    network = _network(pool, policy, network, forwards)
    ports = [f["hostPort"] for f in forwards]
    if len(set(ports)) != len(ports):
        raise InvalidArgument("forwards: a host port is forwarded twice", field="forwards")
    quota_consume(tenant=tenant, pool=pool, resource="vcpu", count=vcpus)
    quota_consume(tenant=tenant, pool=pool, resource="memory", count=memory_gib)
    node = _claim_host(pool.id, vcpus, memory_gib, ports)
    if node is None:
        raise CapacityConflict(
            f"no schedulable node of pool {pool.id} that runs VMs has {vcpus} vCPUs and "
            f"{memory_gib} GiB free" + (f" and host ports {ports} unused" if ports else ""),
            vcpus=vcpus, memoryGiB=memory_gib)
    sandbox = Sandbox.objects.create(tenant=tenant, pool=pool, node=node, name=name,
                                     image=chosen, vcpus=vcpus, memory_gib=memory_gib,
                                     forwards=forwards, network=network,
                                     expires_at=expires_at_for(policy, timeout_seconds),
                                     created_at=database_now())
    locked = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    listen = "0.0.0.0" if policy.get("publicForwards") else "127.0.0.1"  # noqa: S104
    spec = node_spec_change_locked(locked, vm_add=vm_of(sandbox, chosen, listen=listen))
    idempotent_remember(tenant_id=tenant.id, scope="sandboxes.create", key=idempotency_key,
                        inputs=inputs, object_id=sandbox.id)
    data = {"nodeId": node.id, "vcpus": vcpus, "memoryGiB": memory_gib,
            "imageId": chosen.id, "network": network, "generation": spec.generation}
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="sandbox.create",
                 target=sandbox.id, data=data)
    event_emit(tenant_id=tenant.id, type=ReservationEvent.SANDBOX_CREATED, subject=sandbox.id,
               payload={"poolId": pool.id, **data})
    return sandbox


@audited
def sandbox_release(*, tenant: Tenant, actor: Principal, sandbox_id: str) -> Sandbox:
    """Stop a sandbox: its VM leaves the node's desired state; its vCPUs and memory come
    back when the node reports the VM stopped."""
    sandbox = access_sandbox_by_id(tenant=tenant, sandbox_id=sandbox_id, lock=True)
    if sandbox.state not in LIVE:
        raise InvalidState(f"sandbox {sandbox.id} is {sandbox.state}", state=sandbox.state)
    _stop_locked(sandbox, actor_id=actor.id, action="sandbox.release",
                 event=ReservationEvent.SANDBOX_RELEASED)
    return sandbox


@audited
def sandbox_expire(*, sandbox_id: str) -> Sandbox | None:
    """Release a sandbox whose time limit has passed (no-op otherwise)."""
    sandbox = (Sandbox.objects.select_for_update(no_key=True, skip_locked=True)
               .filter(pk=sandbox_id, state__in=LIVE, released_at__isnull=True,
                       expires_at__lte=database_now()).first())
    if sandbox is not None:
        _stop_locked(sandbox, actor_id="system", action="sandbox.expire",
                     event=ReservationEvent.SANDBOX_EXPIRED, reason="its time limit passed")
    return sandbox


def _stop_locked(sandbox: Sandbox, *, actor_id: str, action: str, event: EventType,
                 reason: str = "") -> None:
    node = Node.objects.select_for_update(no_key=True).get(pk=sandbox.node_id)
    spec = node_spec_change_locked(node, vm_desired=(sandbox.id, "stopped"))
    if sandbox.state == SandboxState.PAUSED:
        sandbox_meter(sandbox, database_now())  # its paused time, at the paused rate
    sandbox.state = SandboxState.STOPPING
    sandbox.released_at = database_now()
    sandbox.save(update_fields=["state", "released_at"])
    audit_record(tenant_id=sandbox.tenant_id, actor_id=actor_id, action=action,
                 target=sandbox.id, data={"generation": spec.generation}, reason=reason)
    event_emit(tenant_id=sandbox.tenant_id, type=event, subject=sandbox.id,
               payload={"poolId": sandbox.pool_id, "nodeId": sandbox.node_id})


def sandbox_free_locked(sandbox: Sandbox, *, to: str, reason: str = "",
                        exit_status: int | None = None, ended: datetime | None = None) -> None:
    """End a locked sandbox: give back its counters and quota, and meter its running
    window (from the node's boot report to when the node says the VM ended, else now)."""
    now = database_now()
    pool = sandbox.pool
    quota_refund(tenant_id=sandbox.tenant_id, pool=pool, resource="vcpu", count=sandbox.vcpus)
    quota_refund(tenant_id=sandbox.tenant_id, pool=pool, resource="memory",
                 count=sandbox.memory_gib)
    Node.objects.filter(pk=sandbox.node_id).update(
        vcpus_allocated=F("vcpus_allocated") - sandbox.vcpus,
        memory_gib_allocated=F("memory_gib_allocated") - sandbox.memory_gib)
    sandbox_meter(sandbox, ended or now)
    sandbox.state, sandbox.ended_at = to, now
    sandbox.failure_reason, sandbox.exit_status = reason[:300], exit_status
    sandbox.save(update_fields=["state", "ended_at", "failure_reason", "exit_status"])
    pool_replan(sandbox.pool_id)


def sandbox_meter(sandbox: Sandbox, now: datetime) -> None:
    """Meter the sandbox's time since it was last metered (from its boot report), at the
    pool's paused rate while it is paused (in hour-long windows), and start its next window
    now. An end before what was metered (a late report; hours were closed since) takes the
    time after it back, in correction records."""
    start = sandbox.metered_from or sandbox.started_at
    if start is not None:
        rate = paused_rate(sandbox) if sandbox.state == SandboxState.PAUSED else 1.0
        correction = now < start
        for window_start, window_end in hourly(*sorted((start, now))):
            for meter, count in (("vcpu.hours", sandbox.vcpus),
                                 ("memory.gib-hours", sandbox.memory_gib)):
                usage_record(tenant_id=sandbox.tenant_id, subject=sandbox.id, meter=meter,
                             count=count, start=window_start, end=window_end, rate=rate,
                             pool_id=sandbox.pool_id, correction=correction)
    sandbox.metered_from = now
    sandbox.save(update_fields=["metered_from"])
