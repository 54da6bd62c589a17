"""Borrowing and preemption on the real ledger: a preemptible reservation over quota is taken
back, after notice, for a request within quota or of a higher class; never a reservation of
another class, never for a request that would not then fit; the fewest victims, newest
first; withdrawn when the request no longer waits."""

from __future__ import annotations

from datetime import timedelta

from audit.models import AuditEvent
from compute.core.db import database_now
from compute.platform.events.models import Event
from fleet.models import NodeSpec
from fleet.reconcilers import sweep as fleet_sweep
from reservations.metrics import preemptions
from reservations.models import Quota, Reservation
from reservations.reconcilers import sweep
from reservations.services.preemption import reservation_preempted_release
from tests.conftest import POLICY
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.work import run_due_work


def sharing_pool(root, notice=600):
    site = root("sites.create", kind="shared", region="eu-1")
    return root("pools.create", siteId=site["id"], gpuModel="H100",
                policy={**POLICY, "sharing": {"preemptionNoticeSeconds": notice}},
                **{"class": "metal-host"})


def acme_and_globex_high(root):
    """A pool offered to acme (eight GPUs) and to globex (eight, with the class `high`)."""
    pool = sharing_pool(root)
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    root("pools.offer", poolId=pool["id"], to="globex", quota={"gpu": 8},
         priorityClasses=["high"])
    return pool


def row(rsv):
    return Reservation.objects.get(pk=rsv["id"])


def deadline_passes(*victims):
    """The notice runs out (on the database's clock, which the test's transaction fixes):
    the sweep finds the preempted reservations due."""
    Reservation.objects.filter(pk__in=[v["id"] for v in victims]).update(
        preempt_at=database_now() - timedelta(seconds=1))
    sweep()
    fleet_sweep()
    run_due_work()


def preemption_series(pool_id: str) -> dict[str, dict[str, float]]:
    """`bc_preemptions_total` and `bc_preemptions_noticed` of the pool, by tenant."""
    return {family.name: {sample.labels["tenant"]: sample.value for sample in family.samples
                          if sample.labels["pool"] == pool_id and not sample.name.endswith(
                              "_created")}
            for family in preemptions()}


def types_of(rsv):
    return list(Event.objects.filter(subject=rsv["id"]).order_by("seq")
                .values_list("type", flat=True))


def test_a_borrowed_reservation_is_preempted_with_notice_for_a_request_within_quota(
        root, acme, globex):
    pool = sharing_pool(root)
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 4})
    root("pools.offer", poolId=pool["id"], to="globex", quota={"gpu": 8})
    node = make_node(pool["id"])
    borrowed = reserve(acme, pool, 8, priorityClass="preemptible").result
    assert (borrowed["state"], borrowed["borrowed"]) == ("binding", True)
    assert Quota.objects.get(tenant_id=acme.tenant_id, pool_id=pool["id"]).used == 0
    run_due_work()  # bound: the node is told to hold it
    assert row(borrowed).state == "binding"

    needs = reserve(globex, pool, 8).result
    assert needs["state"] == "pending"
    run_due_work()  # the pool's queue: nothing free, so what was borrowed is taken back
    victim = row(borrowed)
    assert victim.preempted_for == needs["id"]
    notice = (victim.preempt_at - database_now()).total_seconds()
    assert 590 < notice <= 600
    assert types_of(borrowed)[-1] == "reservation.preempting"
    spec = NodeSpec.objects.filter(node=node).latest("generation").spec
    assert [a.get("preemptAt") for a in spec["allocations"]] == [victim.preempt_at.isoformat()]
    preempt = AuditEvent.objects.get(action="reservation.preempt")
    assert (preempt.target, preempt.data["victims"]) == (needs["id"], [borrowed["id"]])
    assert acme("reservations.get", reservationId=borrowed["id"])["preemptAt"] is not None
    assert preemption_series(pool["id"]) == {"bc_preemptions": {"acme": 0},
                                             "bc_preemptions_noticed": {"acme": 1}}

    deadline_passes(borrowed)
    assert row(borrowed).state == "released"
    assert preemption_series(pool["id"]) == {"bc_preemptions": {"acme": 1},
                                             "bc_preemptions_noticed": {"acme": 0}}
    assert row(borrowed).failure_reason == f"preempted for {needs['id']}"
    released = AuditEvent.objects.get(action="reservation.preempted")
    assert (released.target, released.data["victims"]) == (needs["id"], [borrowed["id"]])
    assert row(needs).state in ("placed", "binding")
    assert Quota.objects.get(tenant_id=acme.tenant_id, pool_id=pool["id"]).used == 0


def test_borrowing_takes_only_what_is_free_now(root, acme):
    pool = sharing_pool(root)
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 2})
    make_node(pool["id"])
    reserve(root, pool, 8)
    refused = reserve(acme, pool, 4, priorityClass="preemptible")
    assert (refused.status, refused.code) == (409, "quota_exceeded")
    assert "borrows only what is free now" in refused.message
    over = reserve(acme, pool, 4)  # not preemptible: the quota is a hard cap
    assert over.code == "quota_exceeded"
    assert not Reservation.objects.filter(tenant_id=acme.tenant_id).exists()


def test_a_higher_class_preempts_the_newest_fewest_and_never_another_class(root, acme, globex):
    pool = sharing_pool(root)
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    root("pools.offer", poolId=pool["id"], to="globex", quota={"gpu": 8},
         priorityClasses=["high", "normal"])
    make_node(pool["id"])
    oldest = reserve(acme, pool, 4, priorityClass="preemptible").result
    middle = reserve(acme, pool, 2, priorityClass="preemptible").result
    newest = reserve(acme, pool, 2, priorityClass="preemptible").result
    # Two GPUs: the newest of the reservations that each free enough.
    two = reserve(globex, pool, 2, priorityClass="high").result
    run_due_work()
    assert [row(r).preempted_for for r in (oldest, middle, newest)] == ["", "", two["id"]]
    # Four more: one reservation (the oldest, four GPUs) rather than two of two.
    four = reserve(globex, pool, 4, priorityClass="high").result
    run_due_work()
    assert [row(r).preempted_for for r in (oldest, middle)] == [four["id"], ""]


def test_nothing_is_preempted_that_is_not_preemptible_or_would_not_make_the_request_fit(
        root, acme, globex):
    pool = acme_and_globex_high(root)
    make_node(pool["id"])
    steady = reserve(acme, pool, 4).result  # normal: never preempted
    spare = reserve(acme, pool, 4, priorityClass="preemptible").result
    whole = reserve(globex, pool, 8, priorityClass="high").result  # 4 freed is not enough
    run_due_work()
    assert (row(steady).preempt_at, row(spare).preempt_at) == (None, None)
    assert row(whole).state == "pending"
    assert not AuditEvent.objects.filter(action="reservation.preempt").exists()


def test_a_preemption_is_withdrawn_when_the_request_no_longer_waits(root, acme, globex):
    pool = acme_and_globex_high(root)
    node = make_node(pool["id"])
    spare = reserve(acme, pool, 8, priorityClass="preemptible").result
    run_due_work()
    needs = reserve(globex, pool, 8, priorityClass="high").result
    run_due_work()
    assert row(spare).preempted_for == needs["id"]
    globex("reservations.release", reservationId=needs["id"])  # it gave up waiting
    deadline_passes(spare)
    kept = row(spare)
    assert (kept.state, kept.preempt_at, kept.preempted_for) == ("binding", None, "")
    assert types_of(spare)[-1] == "reservation.preemption_withdrawn"
    spec = NodeSpec.objects.filter(node=node).latest("generation").spec
    assert [a.get("preemptAt") for a in spec["allocations"]] == [None]


def test_the_request_is_placed_as_its_victims_are_released_so_no_new_booking_takes_the_gpus(
        root, acme, globex):
    pool = acme_and_globex_high(root)
    node = make_node(pool["id"])
    spare = reserve(acme, pool, 8, priorityClass="preemptible").result
    needs = reserve(globex, pool, 8, priorityClass="high").result
    run_due_work()
    assert row(spare).preempted_for == needs["id"]
    Reservation.objects.filter(pk=spare["id"]).update(
        preempt_at=database_now() - timedelta(seconds=1))
    released = reservation_preempted_release(reservation_id=spare["id"])
    assert [r.id for r in released] == [spare["id"]]
    # Before any queue has run, the request holds what was freed for it ...
    assert (row(spare).state, row(needs).state) == ("released", "placed")
    audit = AuditEvent.objects.get(action="reservation.preempted")
    assert audit.data == {"victims": [spare["id"]], "placedOn": node.id}
    assert types_of(needs)[-1] == "reservation.placed"
    # ... so a request booked right after the release finds nothing free.
    late = reserve(acme, pool, 8, priorityClass="preemptible")
    assert late.code == "quota_exceeded" or late.result["state"] == "pending"


def test_a_gang_preempts_on_the_nodes_it_lacks_and_is_placed_whole(root, acme, globex):
    pool = acme_and_globex_high(root)
    root("pools.offer", poolId=pool["id"], to="globex", quota={"gpu": 24},
         priorityClasses=["high"])
    for _ in range(3):
        make_node(pool["id"])
    lower = [reserve(acme, pool, 4, priorityClass="preemptible").result for _ in range(2)]
    kept = reserve(root, pool, 8).result  # not preemptible: its node is never taken back
    run_due_work()
    on = {rsv["id"]: row(rsv).allocations.get(ended_at__isnull=True).node_id
          for rsv in (*lower, kept)}
    assert len(set(on.values())) <= 3
    gang = reserve(globex, pool, 8, nodes=2, priorityClass="high").result
    assert gang["state"] == "pending"
    run_due_work()
    # One node is free for one member; the other is made where the fewest are preempted.
    preempted = [rsv for rsv in lower if row(rsv).preempted_for == gang["id"]]
    assert preempted
    assert {on[rsv["id"]] for rsv in preempted} != {on[kept["id"]]}
    assert row(kept).preempted_for == ""
    deadline_passes(*preempted)
    members = Reservation.objects.filter(gang_id=gang["gang"]["id"])
    assert {m.state for m in members} <= {"placed", "binding"}
    assert members.count() == 2
    released = AuditEvent.objects.get(action="reservation.preempted")
    assert released.target == gang["id"]
    assert len(released.data["placedOn"]) == 2


def test_a_gang_is_never_taken_back_in_part(root, acme, globex):
    pool = acme_and_globex_high(root)
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 16})
    for _ in range(2):
        make_node(pool["id"])
    gang = reserve(acme, pool, 8, nodes=2, priorityClass="preemptible").result
    assert gang["state"] == "placed"
    needs = reserve(globex, pool, 8, priorityClass="high").result
    assert needs["state"] == "pending"
    run_due_work()
    assert not Reservation.objects.filter(preempted_for=needs["id"]).exists()
    assert not AuditEvent.objects.filter(action="reservation.preempt").exists()
