"""Add simulated machines to a pool: nodes with a simulated GPU inventory, adopted.

For the development stack only. The machines exist in inventory; no agent runs on them.
"""

from __future__ import annotations

import secrets

from django.core.management.base import BaseCommand, CommandParser

from fleet.inventory import parse_inventory
from fleet.models import Pool
from fleet.services.nodes import node_adopted, node_create, node_inventory_ingest


def simulated_inventory(number: int, variant: str) -> dict[str, object]:
    tag = secrets.token_hex(3)
    if variant == "cpu":
        return {"hostname": f"cpu-{number:02d}", "vcpus": 32, "memoryGiB": 128,
                "serial": f"SIM-{tag}", "productUuid": f"sim-{tag}", "gpus": []}
    return {"hostname": f"gpu-{number:02d}", "vcpus": 96, "memoryGiB": 1024,
            "serial": f"SIM-{tag}", "productUuid": f"sim-{tag}",
            "gpus": [{"uuid": f"GPU-sim{tag}-{i}", "index": i, "product": "H100-SXM5-80GB",
                      "vramGiB": 80, "nvlinkDomain": f"nv{i // 4}"} for i in range(8)]}


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--pool", required=True)
        parser.add_argument("--nodes", type=int, required=True)
        parser.add_argument("--variant", choices=["gpu", "cpu"], default="gpu")

    def handle(self, *args: object, pool: str, nodes: int, variant: str,
               **options: object) -> None:
        target = Pool.objects.get(pk=pool)
        existing = target.nodes.count()
        for number in range(existing + 1, existing + nodes + 1):
            report = parse_inventory(simulated_inventory(number, variant))
            node = node_create(pool=target, actor_id="dev", hostname=report.hostname,
                               serial=report.serial, product_uuid=report.product_uuid)
            node_inventory_ingest(node_id=node.id, report=report)
            node_adopted(node_id=node.id, actor_id="dev", checks=["simulated"])
        self.stdout.write(f"{nodes} simulated node(s) adopted")
