"""Build fleet state through the real service code, with random valid defaults."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from django.db import transaction
from django.utils import timezone

from bcd.contract.crypto import public_pem
from compute.platform.queue.models import WorkItem
from fleet.inventory import parse_inventory
from fleet.models import Connectivity, Node, Pool
from fleet.services.nodes import node_adopt_locked, node_create_locked
from fleet.services.sessions import inventory_report_record, session_open
from tests.support.waiting import wait_until


def inventory(*, gpus: int = 8, domains: tuple[int, ...] = (4, 4), product: str =
              "H100-SXM5-80GB", vram: int = 80, vcpus: int = 96, memory_gib: int = 1024,
              mig: dict[int, list[str]] | None = None, **extra: Any) -> dict[str, Any]:
    """A wire-form inventory report: `gpus` GPUs split into NVLink domains of these sizes;
    `mig` gives GPUs in MIG mode their instances' profiles, by GPU index."""
    tag = secrets.token_hex(4)
    domain_of = [f"nv{n}" for n, size in enumerate(domains) for _ in range(size)]
    instances = mig or {}
    return {
        "hostname": f"gpu-{tag}", "vcpus": vcpus, "memoryGiB": memory_gib,
        "serial": f"SN-{tag}", "productUuid": f"uuid-{tag}",
        "gpus": [{"uuid": f"GPU-{tag}-{i}", "index": i, "product": product, "vramGiB": vram,
                  "nvlinkDomain": domain_of[i] if i < len(domain_of) else "",
                  "mig": [{"uuid": f"MIG-{tag}-{i}-{j}", "profile": profile,
                           "vramGiB": int(profile.split("g.")[1].rstrip("gb"))}
                          for j, profile in enumerate(instances.get(i, []))]}
                 for i in range(gpus)],
        **extra,
    }


def make_bare_node(pool: Pool | str, **hardware: Any) -> Node:
    """A node as a join leaves it: `adopting`, no inventory yet (the join's own helper)."""
    pool = pool if isinstance(pool, Pool) else Pool.objects.get(pk=pool)
    with transaction.atomic():
        return node_create_locked(pool=pool, **hardware)


def make_provisioner(pool: Pool | str) -> tuple[Node, ec.EllipticCurvePrivateKey]:
    """A provisioner of the pool's site as its join leaves it, with its node key."""
    key = ec.generate_private_key(ec.SECP256R1())
    node = make_bare_node(pool, hostname="provisioner", serial="PROV-1", role="provisioner")
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
    return Node.objects.get(pk=node.pk), key


def open_session(node_id: str, journal_epoch: int = 0, journal_generation: int = 0) -> int:
    """Open a session as the gateway does, and record it as a worker then does; the epoch."""
    from fleet.reports import reconcile_reports

    epoch = session_open(node_id=node_id, journal_epoch=journal_epoch,
                         journal_generation=journal_generation)
    reconcile_reports(node_id)
    return epoch


def report_inventory(node: Node, report: dict[str, Any]) -> bool:
    """Send `report` as the node's agent does: over a (new) session, with a fresh report id."""
    epoch = open_session(node.id)
    return inventory_report_record(node_id=node.id, epoch=epoch, report_id=secrets.token_hex(8),
                                   body=json.dumps(report))


def make_node(pool: Pool | str, *, adopted: bool = True, **report: Any) -> Node:
    """A node that joined, reported `inventory(**report)` and (by default) passed acceptance."""
    wire = inventory(**report)
    parsed = parse_inventory(wire)
    node = make_bare_node(pool, hostname=parsed.hostname, serial=parsed.serial,
                          product_uuid=parsed.product_uuid)
    report_inventory(node, wire)
    if adopted:
        with transaction.atomic():
            locked = Node.objects.select_for_update().select_related("pool").get(pk=node.pk)
            if locked.provision_state != "adopted":
                node_adopt_locked(locked, checks=["diag.nvml"])
    return Node.objects.get(pk=node.id)


def lapse_lease(node_id: str) -> Node | None:
    """The node's last heartbeat moves an hour back, then the liveness sweep runs (the real
    path, without sleeping out a lease); returns the node once it turned unreachable (None if
    it did not within 10 s). What the gateway filed of the node's sessions is recorded first
    (by the test's reports applier, if it runs one), as liveness waits for it; a heartbeat a
    gateway received before the session ended may still be written after the move, so the
    move is made again until the sweep finds the node silent."""
    from fleet.reconcilers import NODE, reconcile_node, sweep
    from fleet.services.sessions import session_changes_pending

    def lapsed() -> bool:
        if session_changes_pending(node_id):
            return False
        Node.objects.filter(pk=node_id).update(
            last_heartbeat_at=timezone.now() - timedelta(hours=1))
        sweep()
        if WorkItem.objects.filter(kind=NODE, key=node_id).exists():
            reconcile_node(node_id)
        return Node.objects.get(pk=node_id).connectivity == Connectivity.UNREACHABLE

    return Node.objects.get(pk=node_id) if wait_until(lapsed, 10, interval=0.05) else None


def make_unreachable(node: Node) -> None:
    """A connected node silent past its lease is swept to unreachable."""
    Node.objects.filter(pk=node.pk).update(connectivity=Connectivity.CONNECTED)
    assert lapse_lease(node.id) is not None


IMAGE_PART = {"url": "file:///var/lib/images/part", "sha256": "0" * 64}


def with_default_image(api: Any, pool: dict[str, Any]) -> dict[str, Any]:
    """The pool, now with an image named default (its parts are never fetched: no agent
    runs in these tests)."""
    api("images.create", poolId=pool["id"], name="default", kernel=IMAGE_PART,
        initrd=IMAGE_PART)
    return pool
