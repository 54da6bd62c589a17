"""Usage that can be billed: closed on the hour while a reservation runs, reported per tenant,
pool, meter and day equal to what the ledger's bookings held (on a random workload), and
delivered to each metering sink exactly once by id, through a sink that fails for a while."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from compute.core.db import database_now
from compute.platform.iam.usage import IamUsage
from reservations.models import Booking, Reservation, UsageDelivery, UsageRecord
from reservations.reconcilers import sweep
from reservations.services.metering import hour_floor
from reservations.services.usage_close import usage_close
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.receiver import Receiver, receiving
from tests.support.work import run_due_work


def started_hours_ago(rsv: dict, hours: float) -> Reservation:
    """The reservation as if it had started `hours` ago (its window and bookings moved back
    together: what waiting that long would have made of them)."""
    shift = timedelta(hours=hours)
    row = Reservation.objects.get(pk=rsv["id"])
    row.during = DateTimeTZRange(row.during.lower - shift, row.during.upper - shift, "[)")
    row.save(update_fields=["during"])
    for booking in Booking.objects.filter(allocation__reservation_id=rsv["id"]):
        booking.during = DateTimeTZRange(booking.during.lower - shift,
                                         booking.during.upper - shift, "[)")
        booking.save(update_fields=["during"])
    return row


def test_a_running_reservation_is_metered_on_each_hour_and_the_rest_at_its_end(root, pool):
    make_node(pool["id"])
    rsv = reserve(root, pool, 2, duration=6 * 3_600_000).result
    started = started_hours_ago(rsv, 3.5).during.lower
    now = database_now()
    sweep()
    run_due_work()  # the sweep finds it behind by three hours and more: closed to the hour
    records = list(UsageRecord.objects.filter(subject=rsv["id"]).order_by("window_start"))
    assert records[0].window_start == started
    assert [r.window_end for r in records][-1] == hour_floor(now)
    assert all(r.window_end.minute == 0 == r.window_end.second for r in records)
    assert all(a.window_end == b.window_start for a, b in itertools.pairwise(records))
    hours = Decimal((hour_floor(now) - started).total_seconds()) / 3600
    assert sum(r.quantity for r in records) == pytest.approx(2 * hours, abs=Decimal("1e-5"))
    assert {(r.pool_id, r.priority_class, r.meter) for r in records} == {
        (pool["id"], "normal", "gpu.H100.hours")}
    assert UsageDelivery.objects.filter(record__subject=rsv["id"], sink="iam").count() == len(
        records)
    usage_close(subject_id=rsv["id"])  # again: nothing more to close this hour
    assert UsageRecord.objects.filter(subject=rsv["id"]).count() == len(records)
    root("reservations.release", reservationId=rsv["id"])
    total = sum(r.quantity for r in UsageRecord.objects.filter(subject=rsv["id"]))
    assert total == pytest.approx(2 * Decimal((now - started).total_seconds()) / 3600,
                                  abs=Decimal("1e-5"))


def held_per_tenant(start, end) -> dict[str, Decimal]:
    """What the bookings of reservations that ran held inside [start, end), in atom-hours,
    by tenant: SQL over the ledger itself."""
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT t.slug, sum(EXTRACT(EPOCH FROM least(upper(b.during), %(end)s)
                                               - greatest(lower(b.during), %(start)s)) / 3600)
              FROM reservations_booking b
              JOIN reservations_allocation a ON a.id = b.allocation_id
              JOIN reservations_reservation r ON r.id = a.reservation_id
              JOIN compute_tenant t ON t.id = r.tenant_id
             WHERE b.during && tstzrange(%(start)s, %(end)s)
               AND r.state IN ('released', 'placed', 'binding', 'active')
             GROUP BY 1""", {"start": start, "end": end})
        return {slug: Decimal(total) for slug, total in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)  # real time passes: windows start and end
def test_the_report_equals_what_the_bookings_held_on_a_random_workload(root, acme, pool):
    chance = random.Random(46)
    for _ in range(2):
        make_node(pool["id"])
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 16})
    start = database_now()
    booked = []
    for n in range(14):
        client = chance.choice([root, acme])
        answer = reserve(client, pool, chance.randint(1, 3),
                         duration=chance.randint(1500, 5000),
                         **({"startIn": chance.randint(300, 1500)} if n % 3 == 0 else {}))
        if answer.ok:
            booked.append((client, answer.result))
    assert len(booked) >= 10
    time.sleep(1.0)
    for client, rsv in chance.sample(booked, 4):  # some end early
        client.call("reservations.release", reservationId=rsv["id"])
    extended = booked[-1]
    extended[0].call("reservations.extend", reservationId=extended[1]["id"], by=20_000)
    time.sleep(2.5)
    sweep()
    run_due_work()  # what started is bound, what ended expired
    cut = database_now()
    time.sleep(0.5)
    report = root("usage.report", **{"from": start.isoformat(), "to": cut.isoformat(),
                                      "groupBy": "tenant,meter"})
    found = {row["tenant"]: Decimal(row["quantity"]) for row in report["rows"]}
    held = held_per_tenant(start, cut)
    assert set(found) == set(held) == {"root", "acme"}
    for tenant, quantity in held.items():
        assert found[tenant] == pytest.approx(quantity, abs=Decimal("0.00005")), tenant
    assert {row["meter"] for row in report["rows"]} == {"gpu.H100.hours"}
    mine = acme("usage.report", **{"from": start.isoformat(), "to": cut.isoformat(),
                                   "groupBy": "tenant"})  # a tenant sees its own only
    assert [(r["tenant"], Decimal(r["quantity"])) for r in mine["rows"]] == [
        ("acme", found["acme"])]


@pytest.fixture
def billing(settings) -> Iterator[Receiver]:
    settings.BC_WEBHOOK_ALLOW = "127.0.0.1/32"
    with receiving() as receiver:
        settings.BC_USAGE_SINK_URLS = receiver.url
        yield receiver


def test_a_sink_down_for_a_while_then_receives_every_record_exactly_once(root, pool, billing):
    make_node(pool["id"])
    billing.status = 503
    for count in (1, 2, 3):
        started_hours_ago(reserve(root, pool, count, duration=4 * 3_600_000).result, 2.2)
    sweep()
    run_due_work()  # closed on the hour
    run_due_work()  # delivered to each sink (the records queued their delivery)
    records = set(UsageRecord.objects.values_list("id", flat=True))
    assert len(records) >= 6
    assert set(IamUsage.objects.values_list("record_id", flat=True)) == records  # the IAM's
    failing = UsageDelivery.objects.filter(sink=billing.url)
    assert {d.last_error for d in failing} == {"answered 503"}
    for _ in range(2):  # down a while longer: attempts back off
        UsageDelivery.objects.filter(delivered_at__isnull=True).update(
            next_attempt_at=database_now() - timedelta(seconds=1))
        sweep()
        run_due_work()
    assert {d.attempts for d in failing.all()} == {3}
    billing.status = 200
    UsageDelivery.objects.filter(delivered_at__isnull=True).update(
        next_attempt_at=database_now() - timedelta(seconds=1))
    sweep()
    run_due_work()
    events = billing.messages()
    ids = [event["id"] for event in events]
    assert sorted(ids) == sorted(records)  # each once
    assert {(e["specversion"], e["type"]) for e in events} == {
        ("1.0", "com.better-compute.usage")}
    assert {headers["content-type"] for headers, _ in billing.received} == {
        "application/cloudevents+json"}
    assert not UsageDelivery.objects.filter(delivered_at__isnull=True).exists()
    sweep()
    run_due_work()
    assert len(billing.received) == len(records)  # nothing sent twice
