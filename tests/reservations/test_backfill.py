"""Planned starts on the real ledger: a request that fits nowhere now is booked at its
earliest window; smaller requests use its GPUs before that start only if they end by it; the
planned start never moves later, and moves to now when GPUs free first."""

from __future__ import annotations

import itertools
import threading

import pytest

from audit.models import AuditEvent
from compute.core.db import database_now
from compute.platform.events.models import Event
from reservations.models import Booking, Quota, Reservation
from reservations.reconcilers import reconcile_pool
from tests.conftest import POLICY
from tests.factories import make_node
from tests.reservations.conftest import HOUR, reserve
from tests.support.ledger import overlapping_bookings


def planning_pool(root, plan=True):
    site = root("sites.create", kind="shared", region="eu-1")
    return root("pools.create", siteId=site["id"], gpuModel="H100",
                policy={**POLICY, "sharing": {"planStarts": plan}}, **{"class": "metal-host"})


def row(rsv):
    return Reservation.objects.get(pk=rsv["id"])


def devices_of(rsv):
    return set(Booking.objects.filter(allocation__reservation_id=rsv["id"],
                                      allocation__ended_at__isnull=True)
               .values_list("device_id", flat=True))


def test_a_request_that_fits_nowhere_now_is_planned_and_smaller_ones_backfill_before_it(
        root, pool):
    pool = planning_pool(root)
    make_node(pool["id"])
    long = reserve(root, pool, 4, duration=2 * HOUR).result
    short = reserve(root, pool, 4, duration=HOUR).result
    big = reserve(root, pool, 8).result
    assert big["state"] == "pending"
    reconcile_pool(pool["id"])
    planned = row(big)
    assert (planned.state, planned.planned) == ("placed", True)
    assert planned.during.lower == row(long).during.upper  # every GPU free from then
    assert Event.objects.filter(subject=big["id"], type="reservation.planned").exists()
    assert AuditEvent.objects.filter(target=big["id"], action="reservation.plan").count() == 1
    # The short one ends: its GPUs are free until the planned start. A request that ends
    # by then uses them (backfill); one that would not is planned after the big one.
    root("reservations.release", reservationId=short["id"])
    fits = reserve(root, pool, 4, duration=HOUR).result
    assert fits["state"] == "binding"
    assert row(fits).during.upper <= planned.during.lower
    late = reserve(root, pool, 4, duration=3 * HOUR).result
    assert late["state"] == "pending"
    reconcile_pool(pool["id"])
    assert (row(late).state, row(late).planned) == ("pending", False)  # one plan at a time
    # The queue shows the planned start ahead of what waits.
    queue = root("reservations.queue", poolId=pool["id"])["items"]
    assert [(q["reservationId"], q["position"]) for q in queue] == [(big["id"], 1),
                                                                    (late["id"], 2)]
    assert queue[0]["plannedStart"] is not None
    assert queue[0]["why"].startswith("planned to start at ")
    assert queue[1]["plannedStart"] is None
    assert row(big).during == planned.during  # never later
    # Everything in its way ends now: it starts now.
    root("reservations.release", reservationId=long["id"])
    root("reservations.release", reservationId=fits["id"])
    reconcile_pool(pool["id"])
    moved = row(big)
    assert moved.state == "placed"
    assert moved.during.lower < planned.during.lower
    assert Event.objects.filter(subject=big["id"],
                                type="reservation.started_earlier").count() == 1
    assert AuditEvent.objects.filter(target=big["id"],
                                     action="reservation.start_earlier").count() == 1
    assert len(devices_of(big)) == 8  # the planned window was given up, the new one booked
    assert Booking.objects.filter(allocation__reservation_id=big["id"]).count() == 8
    assert overlapping_bookings() == 0


def test_only_the_head_of_the_queue_is_planned_so_a_long_request_is_not_put_behind_every_plan(
        root, pool):
    """Two requests that fit nowhere now: the first is planned; the second, a long one,
    waits unplanned rather than being booked after the first's window, and starts as soon
    as GPUs free that it may use without crossing that plan."""
    pool = planning_pool(root)
    make_node(pool["id"])
    first = reserve(root, pool, 4, duration=HOUR).result
    second = reserve(root, pool, 4, duration=4 * HOUR).result
    big = reserve(root, pool, 8, duration=HOUR).result
    long = reserve(root, pool, 2, duration=20 * HOUR).result
    reconcile_pool(pool["id"])
    assert (row(big).state, row(big).planned) == ("placed", True)
    assert row(big).during.lower == row(second).during.upper
    assert (row(long).state, row(long).planned) == ("pending", False)
    assert not Event.objects.filter(subject=long["id"], type="reservation.planned").exists()
    # The big one starts early when everything in its way ends; the long one is planned
    # next, then starts when GPUs are free for its whole run.
    root("reservations.release", reservationId=first["id"])
    root("reservations.release", reservationId=second["id"])
    reconcile_pool(pool["id"])
    assert row(big).during.lower < row(second).during.upper
    # The big one holds the node now: the long one is the head that fits nowhere, planned
    # when the big one ends.
    assert (row(long).state, row(long).planned) == ("placed", True)
    assert row(long).during.lower == row(big).during.upper
    root("reservations.release", reservationId=big["id"])
    reconcile_pool(pool["id"])
    started = row(long)
    assert started.state == "placed"
    assert started.during.lower <= database_now()
    assert overlapping_bookings() == 0


def test_without_planned_starts_a_stream_of_small_requests_takes_the_gpus_first(root, pool):
    """The pool's default: pending requests are placed where they fit now, so the large
    one waits while smaller ones keep taking the GPUs that free."""
    pool = planning_pool(root, plan=False)
    make_node(pool["id"])
    first = reserve(root, pool, 4, duration=2 * HOUR).result
    reserve(root, pool, 4, duration=HOUR)
    big = reserve(root, pool, 8).result
    reconcile_pool(pool["id"])
    assert row(big).state == "pending"
    assert not row(big).planned
    root("reservations.release", reservationId=first["id"])
    assert reserve(root, pool, 4, duration=3 * HOUR).result["state"] == "binding"
    reconcile_pool(pool["id"])
    assert row(big).state == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_stream_of_small_requests_never_delays_a_planned_start(root, pool):
    """Four bookers stream small requests of every length at one node while a worker
    replans the pool: the big request's planned start never moves later, its GPUs are never
    booked across its window, and every small request placed on them ends by its start."""
    from django.db import connections

    from compute.core.errors import ComputeError
    from compute.platform.tenancy.models import Principal, Tenant
    from reservations.services.book import reservation_create
    from reservations.services.release import reservation_release
    from reservations.shape import Shape

    pool = planning_pool(root)
    make_node(pool["id"])
    tenant = Tenant.objects.get(slug="root")
    actor = Principal.objects.get(pk=root("system.whoami")["principalId"])
    blocker = reserve(root, pool, 6, duration=2 * HOUR).result
    big = reserve(root, pool, 8).result
    reconcile_pool(pool["id"])
    plan = row(big)
    assert plan.planned
    stop, problems = threading.Event(), []
    starts, placed, refused = [plan.during.lower], [], []

    def stream(seed: int) -> None:
        import random

        rng = random.Random(seed)
        try:
            while not stop.is_set():
                try:
                    rsv = reservation_create(
                        tenant=tenant, actor=actor, pool_id=pool["id"],
                        shape=Shape(count=rng.choice([1, 1, 2])),
                        duration_ms=rng.choice([HOUR // 4, HOUR, 3 * HOUR]))
                except ComputeError as error:
                    refused.append(error.code)
                    continue
                if rsv.state == "binding":  # placed, and bound at once: it starts now
                    placed.append(rsv.id)
                if rsv.state != "binding" or rng.random() < 0.9:
                    reservation_release(tenant=tenant, actor=actor, reservation_id=rsv.id)
        except Exception:  # anything else is a finding
            import traceback
            problems.append(traceback.format_exc())
        finally:
            connections.close_all()

    def replan() -> None:
        try:
            while not stop.is_set():
                reconcile_pool(pool["id"])
                starts.append(Reservation.objects.get(pk=big["id"]).during.lower)
        except Exception:
            import traceback
            problems.append(traceback.format_exc())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=stream, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=replan))
    for thread in threads:
        thread.start()
    stop.wait(8)
    stop.set()
    for thread in threads:
        thread.join(60)
    assert problems == [], "\n".join(problems)
    assert len(placed) > 3, refused  # the small ones ran, on the two free GPUs
    assert len(starts) > 2
    assert all(later <= earlier for earlier, later in itertools.pairwise(starts))
    final = row(big)
    assert final.during == plan.during  # the blocker still holds six GPUs until then
    mine = devices_of(big)
    assert len(mine) == 8
    in_the_way = Booking.objects.filter(
        device_id__in=mine, during__overlap=final.during).exclude(
        allocation__reservation_id=big["id"])
    assert not in_the_way.exists()
    backfilled = Reservation.objects.filter(
        pk__in=placed, allocations__bookings__device_id__in=mine).distinct()
    assert backfilled.exists()  # the two free GPUs are the big one's too, from its start
    assert all(r.during.upper <= final.during.lower for r in backfilled)
    assert row(blocker).state in ("placed", "binding")
    assert overlapping_bookings() == 0


def test_a_request_that_may_preempt_now_is_not_planned_for_later(root):
    """Where preemption would make a high-priority request fit now, it preempts: it is not
    booked at the window after the preemptible work would have ended."""
    pool = planning_pool(root)
    make_node(pool["id"])
    spot = reserve(root, pool, 8, duration=10 * HOUR, priorityClass="preemptible").result
    urgent = reserve(root, pool, 4, priorityClass="high").result
    assert urgent["state"] == "pending"
    reconcile_pool(pool["id"])
    assert (row(urgent).state, row(urgent).planned) == ("pending", False)
    assert row(spot).preempted_for == urgent["id"]  # room is being made for it
    reconcile_pool(pool["id"])  # and while it is, it is not planned either
    assert row(urgent).state == "pending"
    small = reserve(root, pool, 2).result  # a normal one, with nothing it may preempt
    reconcile_pool(pool["id"])
    assert (row(small).state, row(small).planned) == ("placed", True)


def test_a_request_across_models_is_planned_in_another_of_its_pools_that_has_room_for_a_plan(
        root, acme):
    """A request for "H100 or A100" waits in its H100 pool, which already carries a plan:
    the A100 pool, whose GPUs free sooner, plans it there, its quota moved with it, and
    the planned start is audited and evented in the A100 pool."""
    site = root("sites.create", kind="shared", region="eu-1")
    h100, a100 = (root("pools.create", siteId=site["id"], gpuModel=model, policy={
        **POLICY, "sharing": {"planStarts": True}}, **{"class": "metal-host"})
        for model in ("H100", "A100"))
    make_node(h100["id"])
    make_node(a100["id"], product="A100-80GB")
    reserve(root, h100, 8, duration=10 * HOUR)
    ahead = reserve(root, h100, 8).result  # planned in H100 after the ten hours
    a100_busy = reserve(root, a100, 4, duration=2 * HOUR).result
    for pool in (h100, a100):
        root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    either = acme.call("reservations.create", poolId=h100["id"], duration=HOUR, devices=[
        {"class": "gpu", "count": 8, "models": ["H100", "A100"]}]).result
    assert either["state"] == "pending"
    reconcile_pool(h100["id"])
    assert (row(ahead).state, row(ahead).planned) == ("placed", True)
    assert (row(either).state, row(either).pool_id) == ("pending", h100["id"])  # one plan
    reconcile_pool(a100["id"])
    planned = row(either)
    assert (planned.state, planned.planned, planned.pool_id) == ("placed", True, a100["id"])
    assert planned.during.lower == row(a100_busy).during.upper
    plan = AuditEvent.objects.get(target=either["id"], action="reservation.plan")
    assert (plan.data["fromPool"], plan.data["poolId"]) == (h100["id"], a100["id"])
    event = Event.objects.get(subject=either["id"], type="reservation.planned")
    assert event.payload["poolId"] == a100["id"]
    used = dict(Quota.objects.filter(tenant__slug="acme", resource="gpu")
                .values_list("pool_id", "used"))
    assert used == {h100["id"]: 0, a100["id"]: 8}
    assert overlapping_bookings() == 0
