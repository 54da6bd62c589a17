"""What holds a node, in the words of the apps that book nodes.

A node is retired or undeployed only when nothing holds it. Each app that books nodes
declares, in its own `holders.py`, a function that names what of its own holds a node
(`node_holder`); they are collected when the fleet app starts, as report kinds are.
"""

from __future__ import annotations

from collections.abc import Callable

from compute.core.errors import InvalidState
from fleet.models import Node

HOLDERS: list[Callable[[Node], list[str]]] = []


def node_holder(names_holds: Callable[[Node], list[str]]) -> Callable[[Node], list[str]]:
    """Declare a function naming what holds a node (e.g. ["reservation rsv_…"])."""
    HOLDERS.append(names_holds)
    return names_holds


def node_held_by(node: Node) -> list[str]:
    """Everything that holds the node, as the apps name it; empty when nothing does."""
    return [held for names_holds in HOLDERS for held in names_holds(node)]


def refuse_while_held(node: Node, doing: str) -> None:
    """InvalidState naming what holds the node (the ledger's word, and its host counters),
    unless nothing does."""
    held = node_held_by(node)
    if held or node.vcpus_allocated or node.memory_gib_allocated:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise InvalidState(f"node {node.id} still holds {shown or 'host capacity'}: release "
                           f"or move it before it is {doing}", holds=held[:50])
