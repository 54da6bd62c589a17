"""GPU-hour budgets per period on an offering: exactly at the budget books, one over is
refused naming the budget and the numbers, a booking across the period change counts in each
period for its part, a class's budget counts that class only, future bookings count, and
`usage.budgets` shows budget, booked and used. Periods start at midnight in the pool's time
zone."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from compute.core.db import database_now
from reservations.budgets import period_of
from tests.conftest import POLICY
from tests.factories import make_node

ZONE = ZoneInfo("Asia/Tokyo")
HOUR = 3_600_000


@pytest.fixture
def budgeted(root, acme):
    """A pool in Tokyo's time zone offered to acme with 10 GPU-hours a day, and 4 a day of
    class high."""
    site = root("sites.create", kind="shared", region="ap-1")
    pool = root("pools.create", siteId=site["id"], gpuModel="H100",
                policy={**POLICY, "timeZone": "Asia/Tokyo"}, **{"class": "metal-host"})
    make_node(pool["id"])
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8},
         priorityClasses=["normal", "high"],
         limits={"budgets": [{"gpuHours": 10, "period": "day"},
                             {"gpuHours": 4, "period": "day", "priorityClass": "high"}]})
    return pool


def tomorrow(hour: float) -> datetime:
    """`hour` o'clock tomorrow in Tokyo (may pass midnight into the day after)."""
    _, midnight = period_of(database_now(), "day", ZONE)
    return midnight + timedelta(hours=hour)


def book(client, pool, gpus: int, start: datetime, hours: float, **extra):
    return client.call("reservations.create", poolId=pool["id"], start=start.isoformat(),
                       duration=int(hours * HOUR), devices=[{"class": "gpu", "count": gpus}],
                       **extra)


def test_exactly_the_budget_books_and_one_minute_more_is_refused(acme, budgeted):
    assert book(acme, budgeted, 2, tomorrow(1), 5).ok  # 10 GPU-hours
    over = book(acme, budgeted, 1, tomorrow(8), 1 / 60)
    assert (over.status, over.code) == (409, "limit_exceeded"), over.body
    assert over.body["error"]["message"].startswith(
        "limit budget 10 GPU-hours per day: 10.00 GPU-hours booked")
    details = over.body["error"]["details"]
    assert (details["booked"], details["allowed"], details["period"]) == (10, 10, "day")
    assert abs(details["requested"] - 1 / 60) < 1e-6
    assert datetime.fromisoformat(details["periodStart"]) == tomorrow(0)
    assert book(acme, budgeted, 1, tomorrow(24 + 1), 1 / 60).ok  # the next day is its own


def test_a_booking_across_midnight_counts_in_each_day_for_its_part(acme, budgeted):
    assert book(acme, budgeted, 2, tomorrow(22), 4).ok  # 4 GPU-h tomorrow, 4 the day after
    assert book(acme, budgeted, 1, tomorrow(24 + 5), 6).ok  # 4 + 6 = 10 the day after
    refused = book(acme, budgeted, 1, tomorrow(10), 6.5)  # 4 + 6.5 tomorrow
    assert (refused.status, refused.code) == (409, "limit_exceeded")
    assert book(acme, budgeted, 1, tomorrow(10), 6).ok  # exactly 10 tomorrow too


def test_a_class_budget_counts_that_class_and_future_bookings_count(acme, budgeted):
    assert book(acme, budgeted, 2, tomorrow(1), 2, priorityClass="high").ok  # 4 high
    refused = book(acme, budgeted, 1, tomorrow(5), 0.5, priorityClass="high")
    assert (refused.status, refused.code) == (409, "limit_exceeded")
    assert "of class high" in refused.body["error"]["message"]
    assert book(acme, budgeted, 1, tomorrow(5), 6).ok  # normal: 4 + 6 = 10 in all
    assert book(acme, budgeted, 1, tomorrow(12), 0.5).status == 409  # the all-class one


def test_an_extension_past_the_budget_is_refused_and_a_cancelled_booking_frees_it(
        acme, budgeted):
    first = book(acme, budgeted, 2, tomorrow(1), 4).result
    grow = acme.call("reservations.extend", reservationId=first["id"], by=int(1.5 * HOUR))
    assert (grow.status, grow.code) == (409, "limit_exceeded")
    assert acme.call("reservations.extend", reservationId=first["id"], by=HOUR).ok  # 10
    assert book(acme, budgeted, 1, tomorrow(12), 1).status == 409
    acme("reservations.release", reservationId=first["id"], cancel=True)
    assert book(acme, budgeted, 1, tomorrow(12), 10).ok


def test_usage_budgets_shows_budget_booked_and_used(acme, budgeted):
    book(acme, budgeted, 2, tomorrow(1), 2, priorityClass="high")
    now_booking = acme.call("reservations.create", poolId=budgeted["id"], duration=HOUR,
                            devices=[{"class": "gpu", "count": 1}])
    assert now_booking.ok
    items = acme("usage.budgets")["items"]
    assert [(b["gpuHours"], b["priorityClass"], b["period"]) for b in items] == [
        (10, None, "day"), (4, "high", "day")]
    today = period_of(database_now(), "day", ZONE)
    assert datetime.fromisoformat(items[0]["periodStart"]) == today[0]
    assert items[0]["used"] == "0.00"  # the clock of this test stands still
    booked_today = min(1.0, (today[1] - database_now()).total_seconds() / 3600)
    assert abs(float(items[0]["booked"]) - booked_today) <= 0.01
    assert items[1]["booked"] == "0.00"  # the high booking is tomorrow's


@pytest.mark.django_db(transaction=True)
def test_bookers_racing_for_a_budget_never_book_past_it(root, acme, budgeted):
    """Twelve bookings of 2 GPU-hours racing on real Postgres against 10 GPU-hours a day:
    five succeed, the rest are refused, and the ledger holds exactly 10 (a booking takes
    the tenant's quota row lock with its quota, before the budget is checked)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    start = tomorrow(2)

    def book_one(_: int) -> int:
        try:
            return book(acme, budgeted, 1, start, 2).status
        finally:
            connection.close()

    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(book_one, range(12)))
    assert sorted(statuses) == [200] * 5 + [409] * 7
    assert booked_on_day_one(acme, budgeted) == 10


def extend_all_at_once(client, booked: list[dict]) -> list[int]:
    """Each booking extended by an hour, all at once (a thread and a connection each)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    def extend(rsv: dict) -> int:
        try:
            return client.call("reservations.extend", reservationId=rsv["id"], by=HOUR).status
        finally:
            connection.close()

    with ThreadPoolExecutor(len(booked)) as threads:
        return list(threads.map(extend, booked))


def booked_on_day_one(client, pool) -> float:
    """GPU-hours the client's tenant has booked in the pool tomorrow (Tokyo's day)."""
    from fleet.models import Pool
    from reservations.budgets import booked_hours

    day_start, day_end = period_of(tomorrow(1), "day", ZONE)
    return booked_hours(tenant_id=client.tenant_id, pool=Pool.objects.get(pk=pool["id"]),
                        start=day_start, end=day_end, priority_class=None)


@pytest.mark.django_db(transaction=True)
def test_extensions_racing_for_a_budget_never_extend_past_it(root, acme, budgeted):
    """Six 1-hour bookings (6 GPU-hours), then each extended by an hour at once, on real
    Postgres: four extensions fit 10 GPU-hours, two are refused. An extension takes no
    quota, so the budget check takes the tenant's quota row lock itself."""
    booked = [book(acme, budgeted, 1, tomorrow(1 + n * 0.01), 1).result for n in range(6)]
    assert sorted(extend_all_at_once(acme, booked)) == [200] * 4 + [409] * 2
    assert booked_on_day_one(acme, budgeted) == 10


@pytest.mark.django_db(transaction=True)
def test_extensions_on_different_nodes_racing_for_a_budget_never_extend_past_it(root, acme):
    """As above, each booking on a node of its own (six one-GPU machines), so that no node
    lock orders the extensions: only the budget check's own lock on the tenant's quota row
    keeps them from all passing."""
    site = root("sites.create", kind="shared", region="ap-2")
    pool = root("pools.create", siteId=site["id"], gpuModel="H100",
                policy={**POLICY, "timeZone": "Asia/Tokyo"}, **{"class": "metal-host"})
    for _ in range(6):
        make_node(pool["id"], gpus=1, domains=(1,))
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8},
         limits={"budgets": [{"gpuHours": 10, "period": "day"}]})
    booked = [book(acme, pool, 1, tomorrow(1), 1).result for _ in range(6)]
    assert len({rsv["nodeId"] for rsv in booked}) == 6
    for _ in range(3):  # each round starts again from 6 GPU-hours
        statuses = extend_all_at_once(acme, booked)
        assert sorted(statuses) == [200] * 4 + [409] * 2
        assert booked_on_day_one(acme, pool) == 10
        for rsv, status in zip(booked, statuses, strict=True):
            if status == 200:
                assert acme.call("reservations.extend", reservationId=rsv["id"],
                                 by=-HOUR).ok
