"""The earliest slot on hand-built calendars: gaps at the edges and between bookings, NVLink
domains, unhealthy GPUs, cordoned nodes and maintenance windows; and `atEarliest` booking
it, also when bookers race for the same hours. Each calendar is asked twice: with the
bookings' marks not yet mended (every node swept), and with whole groups' free time
recomputed as the workers do."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest
from django.db import connections
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from compute.core.db import database_now
from fleet.models import Device, Node, Pool
from reservations.gaps import gaps_mend
from reservations.models import Allocation, Booking, Reservation
from reservations.placement import Request
from tests.factories import make_node
from tests.reservations.conftest import HOUR, gpus
from tests.support.ledger import overlapping_bookings, run_together

H = timedelta(hours=1)


@pytest.fixture(params=["swept", "mended"], autouse=True)
def mended(request, monkeypatch) -> None:
    """Mended: each search first recomputes the marked free time, as the workers would
    have by then, so whole nodes and NVLink sets are read from their gaps."""
    if request.param == "mended":
        from reservations import earliest as search

        sweep = search.earliest_starts

        def after_mending(*args, **kwargs):
            gaps_mend()
            return sweep(*args, **kwargs)

        monkeypatch.setattr(search, "earliest_starts", after_mending)


@pytest.fixture
def t0() -> datetime:
    """A whole hour a day from now: every calendar below is laid out from it."""
    return (database_now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)


def occupy(node: Node, indexes: range | list[int], start: datetime, end: datetime) -> None:
    """Book exactly these GPUs of the node over [start, end), as a placed reservation."""
    rsv = Reservation.objects.create(
        tenant_id=node.pool.tenant_id, pool=node.pool, count=len(indexes),
        duration_ms=int((end - start) / timedelta(milliseconds=1)), state="placed",
        during=DateTimeTZRange(start, end, "[)"))
    allocation = Allocation.objects.create(reservation=rsv, node=node)
    Booking.objects.bulk_create(
        Booking(allocation=allocation, device=device, during=DateTimeTZRange(start, end, "[)"))
        for device in Device.objects.filter(node=node, index__in=list(indexes)))


def earliest(root, pool, count, hours, *, after, topology="any", **extra):
    return root("capacity.earliest", poolId=pool["id"], devices=gpus(count, topology),
                duration=int(hours * HOUR), after=after.isoformat(), **extra)


def start_of(found) -> datetime:
    assert found["found"] is True, found
    return datetime.fromisoformat(found["window"]["start"].replace("Z", "+00:00"))


def test_an_empty_node_fits_at_once(root, pool, t0):
    node = make_node(pool["id"])
    found = earliest(root, pool, 8, 4, after=t0)
    assert start_of(found) == t0
    assert found["nodeId"] == node.id
    assert len(found["devices"]) == 8
    end = datetime.fromisoformat(found["window"]["end"].replace("Z", "+00:00"))
    assert end - t0 == 4 * H
    assert not Booking.objects.exists()  # books nothing


def test_gaps_at_both_edges(root, pool, t0):
    node = make_node(pool["id"])
    occupy(node, range(8), t0 + 2 * H, t0 + 6 * H)
    assert start_of(earliest(root, pool, 8, 2, after=t0)) == t0  # exactly fits before
    assert start_of(earliest(root, pool, 8, 2.5, after=t0)) == t0 + 6 * H  # after the last
    assert start_of(earliest(root, pool, 8, 1, after=t0 + 3 * H)) == t0 + 6 * H


def test_gaps_between_bookings_and_nvlink_domains(root, pool, t0):
    make_node(pool["id"])  # domains of 4 and 4: GPUs 0-3 are nv0, 4-7 nv1
    node = Node.objects.get()
    occupy(node, range(4), t0, t0 + 4 * H)
    occupy(node, range(4, 8), t0 + 2 * H, t0 + 8 * H)
    occupy(node, range(4, 8), t0 + 9 * H, t0 + 10 * H)
    # nv1 is free [t0, t0+2h) only: too short for 3 h; nv0 frees at t0+4h.
    found = earliest(root, pool, 4, 3, after=t0, topology="nvlink-all")
    assert start_of(found) == t0 + 4 * H
    assert found["nvlinkDomains"] == ["nv0"]
    assert start_of(earliest(root, pool, 4, 2, after=t0, topology="nvlink-all")) == t0
    # Eight GPUs: nv1's gap [t0+8h, t0+9h) holds one hour, not two.
    assert start_of(earliest(root, pool, 8, 1, after=t0)) == t0 + 8 * H
    assert start_of(earliest(root, pool, 8, 2, after=t0)) == t0 + 10 * H
    # Five GPUs over both domains: four of nv1 at t0 are not enough; at t0+8h all are free.
    assert start_of(earliest(root, pool, 5, 1, after=t0)) == t0 + 8 * H


def test_nvlink_all_waits_for_one_whole_domain_where_any_four_gpus_are_free_sooner(root, pool,
                                                                                   t0):
    """Two GPUs of each domain are held: four GPUs are free at once, but no NVLink domain
    has four free until the holds end."""
    make_node(pool["id"])
    node = Node.objects.get()
    occupy(node, [0, 1, 4, 5], t0, t0 + 4 * H)
    assert start_of(earliest(root, pool, 4, 1, after=t0)) == t0
    found = earliest(root, pool, 4, 1, after=t0, topology="nvlink-all")
    assert start_of(found) == t0 + 4 * H
    assert len(found["nvlinkDomains"]) == 1


@pytest.mark.parametrize("whole_groups", [True, False], ids=["whole-groups", "sweep"])
def test_each_nodes_first_start_for_nvlink_all_is_when_one_domain_has_the_count(pool, t0,
                                                                               whole_groups):
    """The search itself, not only the placer after it, keeps to one NVLink domain: its
    first start on the node is when a domain has four free, not when any four are."""
    from reservations import earliest as search

    node = make_node(pool["id"])
    occupy(node, [0, 1, 4, 5], t0, t0 + 4 * H)
    in_pool = Pool.objects.get(id=pool["id"])

    def first_starts(topology: str) -> list[tuple[datetime, str]]:
        return search.earliest_starts(in_pool, Request(count=4, topology=topology), H,
                                      after=t0, latest_start=t0 + 10 * H,
                                      whole_groups=whole_groups)

    assert first_starts("any") == [(t0, node.id)]
    assert first_starts("nvlink-all") == [(t0 + 4 * H, node.id)]


def test_the_earliest_node_wins_and_packing_decides_between_equals(root, pool, t0):
    busy = make_node(pool["id"])
    later = make_node(pool["id"])
    occupy(busy, range(8), t0, t0 + 2 * H)
    occupy(later, range(8), t0, t0 + 5 * H)
    found = earliest(root, pool, 8, 1, after=t0)
    assert (start_of(found), found["nodeId"]) == (t0 + 2 * H, busy.id)


def test_unhealthy_gpus_cordoned_nodes_and_maintenance_are_not_slots(root, pool, t0):
    sick = make_node(pool["id"])
    Device.objects.filter(node=sick, index=3).update(health="unhealthy")
    cordoned = make_node(pool["id"])
    root("nodes.cordon", nodeId=cordoned.id)
    serviced = make_node(pool["id"])
    made = root.call("maintenance.create", nodeId=serviced.id, start=t0.isoformat(),
                     duration=5 * HOUR, reason="PSU swap")
    assert made.ok, made.body
    found = earliest(root, pool, 8, 1, after=t0)
    assert (start_of(found), found["nodeId"]) == (t0 + 5 * H, serviced.id)
    # Seven GPUs fit at once on the sick node, on its healthy ones.
    seven = earliest(root, pool, 7, 1, after=t0)
    assert (start_of(seven), seven["nodeId"]) == (t0, sick.id)
    assert sick.devices.get(index=3).uuid not in seven["devices"]


def test_no_slot_says_why_and_before_bounds_the_window(root, pool, t0):
    node = make_node(pool["id"])
    occupy(node, range(8), t0 + H, t0 + 6 * H)
    bounded = earliest(root, pool, 8, 2, after=t0, before=(t0 + 7 * H).isoformat())
    assert bounded["found"] is False
    assert "no node has 8 GPUs free for 2h starting between" in bounded["reason"]
    assert start_of(earliest(root, pool, 8, 1, after=t0, before=(t0 + 7 * H).isoformat())
                    ) == t0
    fits = earliest(root, pool, 8, 1, after=t0 + H / 2, before=(t0 + 7 * H).isoformat())
    assert start_of(fits) == t0 + 6 * H
    never = earliest(root, pool, 8, 1, after=t0, topology="nvlink-all")
    assert never == {"found": False, "poolId": pool["id"], "gpus": 8,
                     "reason": "no node has 8 GPUs in one NVLink domain (the largest "
                               "domain has 4)"}
    short = root.call("capacity.earliest", poolId=pool["id"], devices=gpus(8),
                      duration=2 * HOUR, after=t0.isoformat(), before=(t0 + H).isoformat())
    assert (short.status, short.body["error"]["details"]["field"]) == (400, "before")
    assert "leaves no room for 2h" in short.body["error"]["message"]


def test_at_earliest_books_the_slot_and_the_next_caller_the_next_one(root, pool, t0):
    node = make_node(pool["id"])
    occupy(node, range(8), t0, t0 + 3 * H)
    body = {"poolId": pool["id"], "devices": gpus(8), "duration": 2 * HOUR,
            "start": t0.isoformat(), "atEarliest": True}
    first = root("reservations.create", **body)
    second = root("reservations.create", **body)
    assert (first["state"], first["start"], first["nodeId"]) == (
        "placed", (t0 + 3 * H).isoformat().replace("+00:00", "Z"), node.id)
    assert second["start"] == (t0 + 5 * H).isoformat().replace("+00:00", "Z")


def test_at_earliest_without_a_slot_is_refused_and_writes_nothing(root, pool, t0):
    make_node(pool["id"])
    before = Reservation.objects.count()
    refused = root.call("reservations.create", poolId=pool["id"], duration=HOUR,
                        devices=gpus(8, "nvlink-all"), atEarliest=True)
    assert (refused.status, refused.code) == (409, "capacity_conflict")
    assert "8 GPUs in one NVLink domain" in refused.body["error"]["message"]
    assert Reservation.objects.count() == before
    alone = root.call("reservations.create", poolId=pool["id"], duration=HOUR,
                      devices=gpus(1), before=(t0 + 2 * H).isoformat())
    assert (alone.status, alone.body["error"]["details"]["field"]) == (400, "before")


@pytest.mark.django_db(transaction=True)
def test_bookers_racing_for_the_earliest_slot_queue_up_without_overlap(root, pool, t0):
    """Six threads ask at once for the earliest two hours of the same eight GPUs: each gets
    its own window, back to back from t0, and no two bookings overlap."""
    from compute.platform.tenancy.models import Principal, Tenant
    from reservations.services.book import reservation_create
    from reservations.shape import Shape

    make_node(pool["id"])
    tenant = Tenant.objects.get(slug="root")
    actor = Principal.objects.get(pk=root("system.whoami")["principalId"])
    gate, starts, problems = threading.Barrier(6), [], []

    def book() -> None:
        try:
            gate.wait()
            rsv = reservation_create(tenant=tenant, actor=actor, pool_id=pool["id"],
                                     shape=Shape(count=8), duration_ms=2 * HOUR,
                                     start=t0, at_earliest=True)
            starts.append(rsv.during.lower)
        except Exception as error:
            problems.append(repr(error))
        finally:
            connections.close_all()

    run_together(*[book] * 6)
    assert problems == []
    assert sorted(starts) == [t0 + 2 * k * H for k in range(6)]
    assert overlapping_bookings() == 0
