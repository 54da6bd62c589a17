"""The statements each hot path costs, pinned: a change that adds a round trip to a booking,
a release, a heartbeat or a report fails here and says which statements it runs now."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.services.sessions import heartbeats_record
from reservations.services.binding import allocation_bound_record
from tests.factories import make_node, open_session
from tests.reservations.conftest import HOUR, reserve
from tests.reservations.test_binding import bound, report  # noqa: F401  (a fixture)


def statements(run) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        run()
    return [q["sql"] for q in captured.captured_queries
            if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]


def pinned(run, count: int) -> None:
    ran = statements(run)
    listing = "\n".join(sql[:160] for sql in ran)
    assert len(ran) == count, f"{len(ran)} statements, pinned at {count}:\n{listing}"


def test_reservations_create_through_the_api(root, pool):
    for _ in range(8):
        make_node(pool["id"])
    reserve(root, pool, 2)  # warm: the token's first use, plans
    # One that starts in an hour: token, the call's running slots (taken, given back), pool,
    # IAM, now(), reservation, placement, node lock, booking (which also marks it placed),
    # work item (with its NOTIFY), event (with its NOTIFY), audit row (no lock)
    pinned(lambda: reserve(root, pool, 2, startIn=HOUR).result, 13)
    # One that starts now is bound by the call instead of a worker: no work item, but the
    # node's row, its bookings' GPUs, the node's spec and the parents of what it holds (is
    # one of these GPUs still held?), the next spec (newest, NOTIFY, signed, written), the
    # reservation's state and the binding event: a worker's whole transaction saved
    pinned(lambda: reserve(root, pool, 2).result, 23)


def test_reservations_release_through_the_api(root, pool):
    make_node(pool["id"])
    rsv = reserve(root, pool, 2, startIn=HOUR).result
    # node lock, recount, the call's running slots (taken, given back), and the row read
    # before it is locked (a gang's member is locked with the others, in their order)
    pinned(lambda: root("reservations.release", reservationId=rsv["id"]), 18)


def test_heartbeats_of_many_nodes_are_one_statement(pool):
    nodes = [make_node(pool["id"]) for _ in range(5)]
    beats = {node.id: open_session(node.id) for node in nodes}
    pinned(lambda: heartbeats_record(beats), 1)


def test_an_allocation_bound_report(root, bound):  # noqa: F811
    key, node, _, hold = bound
    body, signature = report(key, node, hold)
    pinned(lambda: allocation_bound_record(node_id=node.id, body=body, signature=signature),
           7)
