"""Placement scores a shortlist of nodes, not the pool; a request that fits somewhere
outside the shortlist must still be placed, never left pending."""

from __future__ import annotations

from fleet.models import Device
from reservations.candidates import SHORTLIST
from tests.factories import make_node
from tests.reservations.conftest import reserve


def test_a_fit_beyond_the_shortlist_is_placed_not_left_pending(root, pool):
    nodes = sorted((make_node(pool["id"]) for _ in range(SHORTLIST + 2)), key=lambda n: n.id)
    # The first nodes by id have no booking, so they fill the shortlist, but no healthy GPU.
    Device.objects.filter(node__in=nodes[:SHORTLIST]).update(health="unhealthy")
    rsv = reserve(root, pool, 8).result
    assert rsv["state"] == "binding", rsv["failureReason"]
    assert rsv["nodeId"] in {node.id for node in nodes[SHORTLIST:]}
