"""The ledger's second look: a clash the EXCLUDE constraints' GiST indexes do not see is
refused by a recheck read from the rows.

The constraints are dropped inside each test's transaction (rolled back afterwards), which
is what a GiST index that misses a live booking amounts to for the writer it should stop.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

from compute.core.errors import CapacityConflict
from reservations import constraints
from reservations.constraints import BOOKING_NO_OVERLAP, GPU_NO_OVERLAP
from reservations.hostshare import node_lock
from reservations.models import Booking, Reservation
from reservations.placement import Choice, Score
from reservations.services import book, booking, extend
from tests.factories import make_node
from tests.reservations.conftest import HOUR, reserve
from tests.support.ledger import overlapping_bookings


@pytest.fixture
def blind_constraints(db):
    """Both EXCLUDE constraints gone, for this test's transaction only."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no pending checks before ALTER
        for name in (BOOKING_NO_OVERLAP, GPU_NO_OVERLAP):
            cursor.execute(f"ALTER TABLE reservations_booking DROP CONSTRAINT {name}")


@pytest.fixture
def without_recheck(monkeypatch):
    """The recheck turned off where the services call it: the same steps must then let an
    overlap in, so the tests below can fail."""
    monkeypatch.setattr(booking, "refuse_clashes", lambda _clashes: None)
    monkeypatch.setattr(extend, "bookings_refereed", lambda **_: None)


def one_gpu_node_booked_twice(root, pool):
    """A one-GPU node held now for an hour and again from two hours on."""
    node = make_node(pool["id"], gpus=1, domains=(1,))
    first = reserve(root, pool, 1).result
    later = reserve(root, pool, 1, startIn=2 * HOUR).result
    assert (first["state"], later["state"]) == ("binding", "placed")
    return node, first, later


def test_an_extension_into_a_booking_the_index_missed_is_refused(root, pool, blind_constraints):
    _node, first, later = one_gpu_node_booked_twice(root, pool)
    answer = root.call("reservations.extend", reservationId=first["id"], by=2 * HOUR)
    assert (answer.status, answer.code) == (409, "capacity_conflict")
    assert answer.body["error"]["details"]["blockedFrom"] == later["start"]
    assert root("reservations.get", reservationId=first["id"])["end"] == first["end"]
    assert overlapping_bookings() == 0


def test_without_the_recheck_the_same_extension_overlaps(root, pool, blind_constraints,
                                                         without_recheck):
    _node, first, _later = one_gpu_node_booked_twice(root, pool)
    root("reservations.extend", reservationId=first["id"], by=2 * HOUR)
    assert overlapping_bookings() == 1


def book_on_the_held_gpu(root, pool):
    """Write a third reservation's booking on the node's one GPU over the first's window, as
    a booker whose read missed the first booking would."""
    node, first, _later = one_gpu_node_booked_twice(root, pool)
    waiting = reserve(root, pool, 1).result
    assert waiting["state"] == "pending"
    rsv = Reservation.objects.get(pk=waiting["id"])
    gpu = Booking.objects.get(allocation__reservation_id=first["id"]).device_id
    choice = Choice(node_id=node.id, device_ids=(gpu,), vcpus=12, memory_gib=96,
                    score=Score(0, 0, 0, 0, node.id))
    now = timezone.now()
    with transaction.atomic():
        node_lock(node.id)
        booking.book_on_node(rsv, choice, book.window(now, HOUR), placed_at=now)


def test_a_booking_on_a_device_the_index_missed_is_refused(root, pool, blind_constraints):
    with pytest.raises(CapacityConflict, match="already booked in that window"):
        book_on_the_held_gpu(root, pool)
    assert overlapping_bookings() == 0


def test_without_the_recheck_the_same_booking_overlaps(root, pool, blind_constraints,
                                                       without_recheck):
    book_on_the_held_gpu(root, pool)
    assert overlapping_bookings() == 1


def test_the_recheck_reads_no_gist_index(root, pool):
    """Its plan names only btree indexes (or none): a GiST index cannot hide a row from it."""
    make_node(pool["id"])
    rsv = reserve(root, pool, 2).result
    allocation = Booking.objects.filter(allocation__reservation_id=rsv["id"]).first()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # an index wherever one can serve
        cursor.execute("EXPLAIN " + constraints.CLASHES_SQL,
                       {"allocation": allocation.allocation_id, "maintenance": None})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    gist = {"reservations_booking_device_no_overlap", "reservations_booking_gpu_no_overlap",
            "reservations_booking_during"}
    assert "reservations_booking_gpu_id" in plan, plan
    assert not any(name in plan for name in gist), plan
