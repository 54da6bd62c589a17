"""Recurring reservations: windows across a daylight-saving change and a month boundary, an
occurrence that does not fit left pending with its reason, one the quota refuses kept on the
series, the reconciler extending the horizon without doubling anything, and release."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from compute.core.errors import InvalidArgument
from reservations.models import Reservation, ReservationSeries
from reservations.reconcilers import sweep
from reservations.recurrence import parse_rule, zone_named
from tests.factories import make_node
from tests.reservations.conftest import gpus, reserve
from tests.support.work import run_due_work


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def windows(rule: str, zone: str, first: date, last: date) -> list[tuple[datetime, datetime]]:
    return list(parse_rule(rule).windows(zone_named(zone), first, last))


def test_a_window_keeps_its_wall_clock_across_daylight_saving_changes():
    spring = windows("daily 09:00-17:00", "Europe/Berlin", date(2027, 3, 27), date(2027, 3, 28))
    assert spring == [(utc("2027-03-27T08:00"), utc("2027-03-27T16:00")),
                      (utc("2027-03-28T07:00"), utc("2027-03-28T15:00"))]
    # Overnight on the night the clocks go back: nine hours instead of eight.
    autumn = windows("daily 22:00-06:00", "Europe/Berlin", date(2027, 10, 30),
                     date(2027, 10, 31))
    assert [end - start for start, end in autumn] == [timedelta(hours=9), timedelta(hours=8)]
    # A start inside the skipped hour moves forward with the clock (02:30 is 03:30 CEST).
    [(start, _)] = windows("daily 02:30-05:00", "Europe/Berlin", date(2027, 3, 28),
                           date(2027, 3, 28))
    assert start == utc("2027-03-28T01:30")


def test_windows_cross_a_month_boundary_and_keep_to_their_days():
    overnight = windows("daily 22:00-06:00", "America/New_York", date(2027, 1, 31),
                        date(2027, 2, 1))
    assert overnight == [(utc("2027-02-01T03:00"), utc("2027-02-01T11:00")),
                         (utc("2027-02-02T03:00"), utc("2027-02-02T11:00"))]
    weekdays = windows("weekdays 09:00-17:00", "UTC", date(2027, 1, 29), date(2027, 2, 1))
    assert [start.date() for start, _ in weekdays] == [date(2027, 1, 29), date(2027, 2, 1)]
    assert [s.date() for s, _ in windows("mon,wed 10:00-11:00", "UTC", date(2027, 2, 1),
                                         date(2027, 2, 7))] == [date(2027, 2, 1),
                                                                date(2027, 2, 3)]


@pytest.mark.parametrize(("text", "said"), [
    ("weekdays 9-17", "is not '<days> HH:MM-HH:MM'"),
    ("fortnightly 09:00-17:00", "fortnightly"),
    ("mon,funday 09:00-17:00", "funday"),
    ("daily 25:00-26:00", "is not HH:MM"),
    ("daily 09:00-09:00", "must not start and end at the same time"),
])
def test_a_rule_that_does_not_parse_names_what_is_wrong(text, said):
    with pytest.raises(InvalidArgument) as caught:
        parse_rule(text)
    assert said in caught.value.message
    assert caught.value.details["field"] == "every"


def create(client, pool, **fields):
    body = {"poolId": pool["id"], "devices": gpus(fields.pop("gpus", 8)), **fields}
    return client.call("series.create", body)


def test_occurrences_across_daylight_saving_are_booked_at_their_wall_clock(root, pool):
    make_node(pool["id"])
    made = create(root, pool, every="daily 09:00-17:00", timezone="Europe/Berlin",
                  **{"from": "2027-03-27"}, until="2027-03-29", horizonDays=366)
    assert made.ok, made.body
    series = made.result
    assert series["occurrences"]["placed"] == 3
    rows = root("reservations.list")["items"]
    assert [(r["start"], r["end"], r["seriesId"]) for r in rows] == [
        ("2027-03-27T08:00:00Z", "2027-03-27T16:00:00Z", series["id"]),
        ("2027-03-28T07:00:00Z", "2027-03-28T15:00:00Z", series["id"]),
        ("2027-03-29T07:00:00Z", "2027-03-29T15:00:00Z", series["id"])]


def test_an_occurrence_that_does_not_fit_stays_pending_with_its_reason(root, pool):
    make_node(pool["id"])
    blocker = root("reservations.create", poolId=pool["id"], devices=gpus(8),
                   duration=3_600_000, start="2027-01-06T10:00:00Z")
    assert blocker["state"] == "placed"
    series = create(root, pool, every="weekdays 09:00-17:00", **{"from": "2027-01-04"},
                    until="2027-01-08", horizonDays=366).result
    assert series["occurrences"] == {**series["occurrences"], "placed": 4, "pending": 1}
    [pending] = root("reservations.list", state="pending")["items"]
    assert pending["start"] == "2027-01-06T09:00:00Z"
    assert "busy" in pending["failureReason"]


def test_occurrences_the_quota_refuses_are_kept_on_the_series_with_why(root, pool, acme):
    make_node(pool["id"])
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    series = create(acme, pool, every="daily 09:00-10:00", **{"from": "2027-01-04"},
                    until="2027-01-06", horizonDays=366).result
    assert series["occurrences"]["placed"] == 1
    assert [r["start"] for r in series["refusals"]] == ["2027-01-05T09:00:00Z",
                                                       "2027-01-06T09:00:00Z"]
    assert "gpu quota" in series["refusals"][0]["reason"]
    events = acme("events.list", subject=series["id"])["items"]
    assert [e["type"] for e in events].count("series.occurrence_refused") == 2


def test_the_reconciler_books_what_enters_the_horizon_and_never_twice(root, pool):
    make_node(pool["id"], vcpus=96 * 20)  # host share is no question here
    today = datetime.now(UTC).date()
    series = create(root, pool, gpus=1, every="daily 23:00-23:30", until=str(
        today + timedelta(days=6)), horizonDays=2).result
    booked = Reservation.objects.filter(series_id=series["id"]).count()
    assert booked in (2, 3)  # today's, if it has not begun, tomorrow's, the day after's
    ReservationSeries.objects.filter(pk=series["id"]).update(horizon_days=5)
    assert sweep() >= 1
    run_due_work()
    assert Reservation.objects.filter(series_id=series["id"]).count() == booked + 3
    ReservationSeries.objects.filter(pk=series["id"]).update(booked_through=None)
    sweep()
    run_due_work()  # every day again: the unique occurrence constraint refuses doubles
    assert Reservation.objects.filter(series_id=series["id"]).count() == booked + 3
    extended = root("audit.list", action="series.extend")["items"]
    assert extended
    assert extended[0]["actorId"] == "system"


def test_release_cancels_the_occurrences_not_begun_and_stops_the_series(root, pool):
    make_node(pool["id"])
    series = create(root, pool, every="daily 09:00-10:00", **{"from": "2027-01-04"},
                    until="2027-01-06", horizonDays=366).result
    released = root("series.release", seriesId=series["id"])
    assert released["occurrences"]["cancelled"] == 3
    assert released["endedAt"] is not None
    again = root.call("series.release", seriesId=series["id"])
    assert (again.status, again.code) == (409, "invalid_state")
    assert reserve(root, pool, 8, start="2027-01-05T09:00:00Z").result["state"] == "placed"


def test_bad_series_are_refused_naming_the_field(root, pool):
    make_node(pool["id"])
    for fields, field in [
        ({"every": "weekdays 9-5", "until": "2027-01-08"}, "every"),
        ({"every": "daily 09:00-10:00", "timezone": "Mars/Olympus", "until": "2027-01-08"},
         "timezone"),
        ({"every": "daily 09:00-10:00", "from": "2027-01-08", "until": "2027-01-04"}, "until"),
        ({"every": "daily 09:00-10:00", "until": "2031-01-01"}, "until"),
    ]:
        answer = create(root, pool, **fields)
        assert answer.status == 400, answer.body
        assert answer.body["error"]["details"]["field"] == field, answer.body
    assert not ReservationSeries.objects.exists()
