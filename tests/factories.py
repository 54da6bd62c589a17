"""Build fleet state through the real services, with random valid defaults."""

from __future__ import annotations

import secrets
from typing import Any

from fleet.inventory import parse_inventory
from fleet.models import Node, Pool
from fleet.services.nodes import node_adopted, node_create, node_inventory_ingest


def inventory(*, gpus: int = 8, domains: tuple[int, ...] = (4, 4), product: str =
              "H100-SXM5-80GB", vram: int = 80, vcpus: int = 96, memory_gib: int = 1024,
              **extra: Any) -> dict[str, Any]:
    """A wire-form inventory report: `gpus` GPUs split into NVLink domains of these sizes."""
    tag = secrets.token_hex(4)
    domain_of = [f"nv{n}" for n, size in enumerate(domains) for _ in range(size)]
    return {
        "hostname": f"gpu-{tag}", "vcpus": vcpus, "memoryGiB": memory_gib,
        "serial": f"SN-{tag}", "productUuid": f"uuid-{tag}",
        "gpus": [{"uuid": f"GPU-{tag}-{i}", "index": i, "product": product, "vramGiB": vram,
                  "nvlinkDomain": domain_of[i] if i < len(domain_of) else ""}
                 for i in range(gpus)],
        **extra,
    }


def make_node(pool: Pool | str, *, adopted: bool = True, **report: Any) -> Node:
    pool = pool if isinstance(pool, Pool) else Pool.objects.get(pk=pool)
    parsed = parse_inventory(inventory(**report))
    node = node_create(pool=pool, actor_id="test", hostname=parsed.hostname,
                       serial=parsed.serial, product_uuid=parsed.product_uuid)
    node_inventory_ingest(node_id=node.id, report=parsed)
    if adopted:
        node_adopted(node_id=node.id, actor_id="test", checks=["diag.nvml"])
    return Node.objects.get(pk=node.id)


def make_unreachable(node: Node) -> None:
    """The real path: a connected node silent past its lease is swept to unreachable."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.services.sessions import nodes_mark_unreachable

    Node.objects.filter(pk=node.pk).update(connectivity="connected",
                                           last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert node.id in nodes_mark_unreachable()
