"""`reservation.ending`: sent at each of the pool's `endingNotices` before a started
reservation's end, once each (again after an extension moves the end), only the nearest when
several fall due at once, never for a pool that asks for none, and delivered to a webhook
like any event."""

from __future__ import annotations

from compute.platform.events.models import Event
from reservations.models import Reservation
from reservations.reconcilers import sweep
from tests.compute.test_webhooks import deliver, receiver  # noqa: F401  (a fixture)
from tests.conftest import POLICY
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.work import run_due_work


def pool_with(root, **policy):
    site = root("sites.create", kind="shared", region="eu-1")
    return root("pools.create", siteId=site["id"], gpuModel="H100",
                policy={**POLICY, **policy}, **{"class": "metal-host"})


def endings(rsv) -> list[dict]:
    return [e.payload for e in Event.objects.filter(subject=rsv["id"],
                                                    type="reservation.ending").order_by("seq")]


def timers_run() -> None:
    sweep()
    run_due_work()


def started(root, pool, minutes: int) -> dict:
    rsv = reserve(root, pool, 1, duration=minutes * 60_000).result
    timers_run()  # bound: binding, started
    assert Reservation.objects.get(pk=rsv["id"]).state == "binding"
    return rsv


def test_each_notice_is_sent_once_and_again_after_an_extension(root, receiver):  # noqa: F811
    hook = root("webhooks.create", url=receiver.url, types="reservation.ending")
    pool = pool_with(root, endingNotices=[5400, 3000])  # 90 and 50 minutes before the end
    make_node(pool["id"])
    rsv = started(root, pool, 60)  # ends in an hour: within the first notice only
    timers_run()
    timers_run()
    assert [(n["notice"], n["poolId"]) for n in endings(rsv)] == [(5400, pool["id"])]
    assert 3590 <= endings(rsv)[0]["inSeconds"] <= 3600
    root("reservations.extend", reservationId=rsv["id"], by=1_800_000)  # ends in 90 min
    timers_run()
    timers_run()
    assert [n["notice"] for n in endings(rsv)] == [5400, 5400]
    deliver()
    assert [(m["type"], m["data"]["subject"]) for m in receiver.messages()] == [
        ("reservation.ending", rsv["id"])] * 2
    assert root("webhooks.get", webhookId=hook["id"])["types"] == ["reservation.ending"]


def test_the_defaults_are_15_and_1_minute_and_only_the_nearest_due_is_sent(root, pool):
    make_node(pool["id"])
    hour = started(root, pool, 60)
    ten = started(root, pool, 10)
    tiny = reserve(root, pool, 1, duration=30_000).result  # both notices due at once
    timers_run()
    timers_run()
    timers_run()
    assert endings(hour) == []
    assert [n["notice"] for n in endings(ten)] == [900]
    assert [n["notice"] for n in endings(tiny)] == [60]


def test_a_pool_that_asks_for_no_notice_gets_none(root):
    pool = pool_with(root, endingNotices=[])
    make_node(pool["id"])
    rsv = started(root, pool, 1)
    timers_run()
    assert endings(rsv) == []


def test_the_node_is_told_each_held_reservations_end_and_its_new_end(root, pool):
    from datetime import datetime

    from fleet.models import NodeSpec

    node = make_node(pool["id"])
    rsv = started(root, pool, 60)

    def told_end() -> datetime:
        spec = NodeSpec.objects.filter(node=node).latest("generation").spec
        [held] = [a for a in spec["allocations"] if a["reservationId"] == rsv["id"]]
        return datetime.fromisoformat(held["endsAt"])

    def shown_end() -> datetime:  # (the API shows milliseconds)
        return datetime.fromisoformat(root("reservations.get", reservationId=rsv["id"])["end"])

    first = told_end()
    assert abs((first - shown_end()).total_seconds()) < 0.001
    root("reservations.extend", reservationId=rsv["id"], by=1_800_000)
    assert abs((told_end() - shown_end()).total_seconds()) < 0.001
    assert (told_end() - first).total_seconds() == 1800
