"""Desired state by generation: each change to a node's device assignments writes the next
NodeSpec generation (never edits one); the gateway pushes the newest to the agent."""

from __future__ import annotations

from typing import Any

from compute.db import CURRENT_TXID
from fleet.models import Node, NodeSpec


def node_spec_change_locked(node: Node, *, add: dict[str, Any] | None = None,
                            remove: str | None = None) -> NodeSpec:
    """Write the next generation with `add` and without allocation `remove` (with neither:
    generation 1 of a newly adopted node, or an unchanged copy).

    The caller holds the node row's lock, which orders generations; the unique constraint
    on (node, generation) is the backstop.
    """
    latest = node.specs.order_by("-generation").first()
    allocations = list(latest.spec.get("allocations", [])) if latest else []
    if remove:
        allocations = [a for a in allocations if a["allocationId"] != remove]
    if add:
        allocations = [a for a in allocations if a["allocationId"] != add["allocationId"]]
        allocations.append(add)
    return NodeSpec.objects.create(node=node, generation=(latest.generation + 1) if latest else 1,
                                   spec={"allocations": allocations}, txid=CURRENT_TXID)
