"""The free time of whole GPU groups, kept by Postgres beside the bookings.

Every kind of booking write (insert, a window moved or cut short, delete, many rows in one
statement, MIG instances, a GPU moved to another NVLink domain) marks what it changed, and
mending the marks leaves the gaps equal to the free time recomputed from the bookings; the
earliest slot read from them (or, for a node with marks, swept) is the one the sweep over
every booking finds; a booker never waits for a mender; and two menders of one node take
turns on their lock, without which they write the gaps twice.
"""

from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from compute.core.db import database_now
from fleet.models import Device, Node
from reservations.earliest import earliest_starts
from reservations.gaps import GAP_DRIFT_SQL, gaps_mend
from reservations.models import Allocation, Booking, GroupGap, Reservation, StaleGaps
from reservations.placement import Request
from tests.factories import make_node
from tests.support.processes import database_url
from tests.support.waiting import wait_until

H = timedelta(hours=1)
TWO = ["3g.40gb", "3g.40gb"]


def drift() -> int:
    with connection.cursor() as cursor:
        cursor.execute(GAP_DRIFT_SQL)
        return int(cursor.fetchone()[0])


def node_gaps() -> list[tuple[datetime | None, datetime | None]]:
    """The whole nodes' gaps, earliest first, an infinite end as None (psycopg loads no
    infinite timestamps)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT CASE WHEN isfinite(lo) THEN lo END, "
                       "CASE WHEN isfinite(hi) THEN hi END FROM reservations_groupgap "
                       "WHERE domain = '' ORDER BY lo")
        return list(cursor.fetchall())


def hour(t0: datetime, start: float, end: float) -> DateTimeTZRange:
    return DateTimeTZRange(t0 + start * H, t0 + end * H, "[)")


def book(node: Node, devices: list[Device], during: DateTimeTZRange) -> Allocation | None:
    """One allocation over these devices, or None where the ledger refuses it."""
    rsv = Reservation.objects.create(
        tenant_id=node.pool.tenant_id, pool=node.pool, count=len(devices), state="placed",
        duration_ms=int((during.upper - during.lower) / timedelta(milliseconds=1)),
        during=during)
    try:
        with transaction.atomic():
            allocation = Allocation.objects.create(reservation=rsv, node=node)
            Booking.objects.bulk_create(Booking(allocation=allocation, device=device,
                                                during=during) for device in devices)
            return allocation
    except IntegrityError:
        return None


@pytest.fixture
def t0() -> datetime:
    return (database_now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)


def test_gaps_follow_every_kind_of_booking_write(pool, t0):
    """180 random writes on two nodes (one with MIG instances), each checked against the
    free time recomputed from scratch."""
    rng = random.Random(11)
    nodes = [make_node(pool["id"], mig={0: TWO, 1: TWO}), make_node(pool["id"])]
    kinds: dict[str, int] = {}
    for _ in range(180):
        node = rng.choice(nodes)
        gpus = list(Device.objects.filter(node=node, device_class="gpu").order_by("index"))
        parts = list(Device.objects.filter(node=node, device_class="mig"))
        mine = [b for b in Booking.objects.filter(device__node=node) if not b.during.isempty]
        roll = rng.random()
        start = rng.randrange(-30, 60) / 2
        during = hour(t0, start, start + rng.randrange(1, 16) / 2)
        if roll < 0.35:
            kind = "whole"
            book(node, rng.sample(gpus, rng.choice((1, 2, 4, 8))), during)
        elif roll < 0.5 and parts:
            kind = "part"
            book(node, [rng.choice(parts)], during)
        elif roll < 0.65 and mine:
            kind = "moved"
            row = rng.choice(mine)
            shift = rng.randrange(-4, 5) / 2 * H
            try:
                with transaction.atomic():
                    lower = row.during.lower + shift
                    upper = max(lower + H / 2, row.during.upper + shift
                                + rng.randrange(-2, 3) / 2 * H)
                    Booking.objects.filter(pk=row.pk).update(
                        during=DateTimeTZRange(lower, upper, "[)"))
            except IntegrityError:
                kind = "moved-refused"
        elif roll < 0.75 and mine:
            kind = "ended"  # as a release ends an allocation now: every row of it at once
            allocation = rng.choice(mine).allocation_id
            cut = t0 + rng.randrange(-30, 40) / 2 * H
            with connection.cursor() as cursor:  # (a row not begun by then is left empty)
                cursor.execute(
                    "UPDATE reservations_booking SET during = tstzrange(lower(during), "
                    "LEAST(upper(during), greatest(%s, lower(during))), '[)') "
                    "WHERE allocation_id = %s", [cut, allocation])
        elif roll < 0.9 and mine:
            kind = "deleted"
            Booking.objects.filter(pk__in=[b.pk for b in rng.sample(mine, min(3, len(mine)))]
                                   ).delete()
        else:
            kind = "domain"  # the node's topology was read again: a GPU changed domain
            gpu = rng.choice(gpus)
            Device.objects.filter(pk=gpu.pk).update(
                nvlink_domain="nv0" if gpu.nvlink_domain != "nv0" else "nv1")
        kinds[kind] = kinds.get(kind, 0) + 1
        assert drift() == 0, (kind, len(kinds))  # the node written to is marked
        gaps_mend()
        assert not StaleGaps.objects.exists()
        assert drift() == 0, (kind, len(kinds))
    assert min(kinds.get(k, 0) for k in ("whole", "part", "moved", "ended", "deleted",
                                         "domain")) > 3, kinds
    assert GroupGap.objects.filter(domain="").exists()
    assert GroupGap.objects.exclude(domain="").exists()


def test_a_group_that_is_booked_then_freed_keeps_no_gap_rows(pool, t0):
    node = make_node(pool["id"])
    assert not GroupGap.objects.exists()  # never booked: free all along, no rows
    allocation = book(node, list(Device.objects.filter(node=node, index__in=[0, 1])),
                      hour(t0, 0, 2))
    assert allocation is not None
    assert not GroupGap.objects.exists()  # marked, not yet mended
    assert set(StaleGaps.objects.values_list("node_id", "domain")) == {(node.id, ""),
                                                                      (node.id, "nv0")}
    assert gaps_mend() == 2
    groups = set(GroupGap.objects.values_list("domain", flat=True))
    assert groups == {"", "nv0"}  # the node, and the NVLink domain of GPUs 0 and 1
    assert node_gaps() == [(None, t0), (t0 + 2 * H, None)]
    Booking.objects.filter(allocation=allocation).delete()
    gaps_mend()
    assert drift() == 0
    assert not GroupGap.objects.exists()


def test_whole_groups_answer_as_the_sweep_over_every_booking_does(pool, t0):
    """Random calendars on six nodes (an unhealthy GPU, MIG instances booked), then 150
    random requests: the gaps give every node the same first start as the sweep, and so do
    nodes with fresh bookings not mended yet."""
    rng = random.Random(5)
    nodes = [make_node(pool["id"]) for _ in range(4)]
    nodes.append(make_node(pool["id"], mig={2: TWO}))
    nodes.append(make_node(pool["id"]))
    Device.objects.filter(node=nodes[5], index=6).update(health="unhealthy")
    for node in nodes:
        gpus = list(Device.objects.filter(node=node, device_class="gpu").order_by("index"))
        parts = list(Device.objects.filter(node=node, device_class="mig"))
        for _ in range(25):
            start = rng.randrange(0, 96) / 2
            during = hour(t0, start, start + rng.randrange(1, 12) / 2)
            if parts and rng.random() < 0.2:
                book(node, [rng.choice(parts)], during)
            else:
                first = rng.randrange(0, 8, 4)
                size = rng.choice((1, 2, 4))
                book(node, gpus[first:first + size] if size == 4 else
                     rng.sample(gpus[first:first + 4], size), during)
    gaps_mend()
    whole_found = 0
    pool_row = nodes[0].pool
    for n in range(150):
        if n == 100:  # two nodes booked again: marked, so swept until mended
            assert book(nodes[1], list(Device.objects.filter(node=nodes[1], device_class="gpu")),
                        hour(t0, 56, 90))
            assert book(nodes[3], list(Device.objects.filter(node=nodes[3], index__lt=4)),
                        hour(t0, 58, 100))
            assert StaleGaps.objects.count() == 5
        count, topology = rng.choice(((8, "any"), (4, "nvlink-all"), (2, "nvlink-all"),
                                      (3, "any"), (7, "any")))
        request = Request(count=count, topology=topology, device_class="gpu")
        duration = rng.randrange(1, 13) / 2 * H
        after = t0 + rng.randrange(-4, 60) / 2 * H
        latest = after + rng.choice((6, 24, 96)) * H
        fast = earliest_starts(pool_row, request, duration, after=after, latest_start=latest)
        slow = earliest_starts(pool_row, request, duration, after=after, latest_start=latest,
                               whole_groups=False)
        assert fast == slow, (count, topology, duration, after)
        whole_found += bool(fast) and count in (8, 4) and fast[0][0] > after
    assert whole_found > 10  # read from the gaps, and not merely "at once"


def mender(url: str) -> psycopg.Connection:
    """A connection in the middle of mending every marked node: it holds their locks."""
    conn = psycopg.connect(url)
    conn.execute("SELECT reservations_groupgap_mend(array_agg(DISTINCT node_id)) "
                 "FROM reservations_stalegaps")
    return conn


def waiting(url: str, pid: int) -> bool:
    with psycopg.connect(url, autocommit=True) as watch:
        return watch.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity "
                             "WHERE pid = %s", [pid]).fetchone()[0]


def whole_node_starts(node: Node, t0: datetime) -> list[tuple[datetime, str]]:
    request = Request(count=8, topology="any", device_class="gpu")
    return earliest_starts(node.pool, request, H, after=t0, latest_start=t0 + 24 * H)


def race_two_menders(node: Node, t0: datetime) -> None:
    """The first mender recomputes a booking of GPU 0 for [t0, t0+1h) and, before it
    commits, a booker adds GPU 1 for [t0+1h, t0+2h) (done at once: bookers never wait for a
    mender) and a second mender starts on the same node. The second waits; the first
    commits, then the second."""
    gpus = list(Device.objects.filter(node=node).order_by("index"))
    book(node, gpus[:1], hour(t0, 0, 1))
    url = database_url()
    with mender(url) as first, psycopg.connect(url) as second:
        assert book(node, gpus[1:2], hour(t0, 1, 2)) is not None
        assert StaleGaps.objects.filter(node_id=node.id).exists()
        pid = second.execute("SELECT pg_backend_pid()").fetchone()[0]
        done = threading.Event()

        def mend_again() -> None:
            second.execute("SELECT reservations_groupgap_mend(ARRAY[%s]::varchar[])",
                           [node.id])
            done.set()

        racer = threading.Thread(target=mend_again)
        racer.start()
        assert wait_until(lambda: waiting(url, pid), 10)
        assert not done.is_set()
        first.commit()
        racer.join(10)
        assert done.is_set()
        second.commit()


@pytest.mark.django_db(transaction=True)
def test_bookers_never_wait_for_a_mender_and_menders_take_turns(pool, t0):
    node = make_node(pool["id"])
    race_two_menders(node, t0)
    assert not StaleGaps.objects.exists()
    assert drift() == 0
    assert node_gaps() == [(None, t0), (t0 + 2 * H, None)]  # both bookings, back to back
    assert whole_node_starts(node, t0) == [(t0 + 2 * H, node.id)]


@pytest.mark.django_db(transaction=True)
def test_without_their_lock_two_menders_leave_the_gaps_wrong(pool, t0):
    """The second mender then waits only for the marks the first deletes, and writes from
    a snapshot without the first's gaps."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef('reservations_groupgap_mend'::regproc)")
        original = cursor.fetchone()[0]
        lock = original[original.index("PERFORM pg_advisory_xact_lock"):]
        lock = lock[:lock.index("locked;") + len("locked;")]
        try:
            cursor.execute(original.replace(lock, ""))
            node = make_node(pool["id"])
            race_two_menders(node, t0)
            assert not StaleGaps.objects.exists()
            assert drift() > 0
            assert node_gaps() != [(None, t0), (t0 + 2 * H, None)]
        finally:
            cursor.execute(original)


def test_the_admin_lists_gaps_to_infinity(client, pool, t0):
    from django.contrib.auth.models import User

    node = make_node(pool["id"])
    book(node, list(Device.objects.filter(node=node, index=0)), hour(t0, 0, 1))
    client.force_login(User.objects.create_superuser("ops", password="pw-123456789"))
    marked = client.get("/admin/reservations/stalegaps/").content.decode()
    assert node.id in marked
    gaps_mend()
    listed = client.get("/admin/reservations/groupgap/").content.decode()
    assert "-infinity" in listed  # free before the booking
    assert "infinity" in listed.replace("-infinity", "")  # and after it, for good
    tail = GroupGap.objects.filter(domain="", lo=t0 + H).values_list("pk", flat=True).get()
    page = client.get(f"/admin/reservations/groupgap/{tail}/change/").content.decode()
    assert "infinity" in page
