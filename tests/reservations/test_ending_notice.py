"""`reservation.ending`: sent once, `endingNoticeSeconds` before a started reservation's end
(again after an extension moves the end), never for a pool that asks for none, and delivered
to a webhook like any event."""

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
                                                    type="reservation.ending")]


def timers_run() -> None:
    sweep()
    run_due_work()


def test_a_started_reservation_is_told_before_its_end_once_and_again_after_an_extension(
        root, receiver):  # noqa: F811
    hook = root("webhooks.create", url=receiver.url, types="reservation.ending")
    pool = pool_with(root, endingNoticeSeconds=5400)  # 90 min: a 1 h booking is within it
    make_node(pool["id"])
    far = pool_with(root, endingNoticeSeconds=600)
    make_node(far["id"])
    rsv = reserve(root, pool, 2).result
    later = reserve(root, far, 2).result  # ends in an hour: not within 10 min
    timers_run()  # bound: binding, started
    assert Reservation.objects.get(pk=rsv["id"]).state == "binding"
    timers_run()
    [notice] = endings(rsv)
    assert notice["poolId"] == pool["id"]
    assert 3590 <= notice["inSeconds"] <= 3600
    assert endings(later) == []
    timers_run()
    assert len(endings(rsv)) == 1  # once per end
    root("reservations.extend", reservationId=rsv["id"], by=1_800_000)  # ends in 90 min
    timers_run()
    assert [n["inSeconds"] for n in endings(rsv)][1] >= 5390
    deliver()
    assert [(m["type"], m["data"]["subject"]) for m in receiver.messages()] == [
        ("reservation.ending", rsv["id"])] * 2
    assert root("webhooks.get", webhookId=hook["id"])["types"] == ["reservation.ending"]


def test_a_pool_that_asks_for_no_notice_gets_none(root):
    pool = pool_with(root, endingNoticeSeconds=0)
    make_node(pool["id"])
    rsv = reserve(root, pool, 1, duration=60_000).result
    timers_run()
    timers_run()
    assert endings(rsv) == []
