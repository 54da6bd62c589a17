"""A request that accepts several GPU models: the tenant's pools of the named pool's site
with one of them are candidates, and the placer's own scoring picks the pool; quotas and
offerings are checked per pool."""

from __future__ import annotations

from audit.models import AuditEvent
from reservations.models import Booking, Quota, Reservation
from reservations.reconcilers import reconcile_pool
from tests.conftest import POLICY
from tests.factories import make_node
from tests.reservations.conftest import HOUR, reserve
from tests.support.writes import recorded


def two_pools(root):
    site = root("sites.create", kind="shared", region="eu-1")
    t4, p100 = (root("pools.create", siteId=site["id"], gpuModel=model, policy=POLICY,
                     **{"class": "metal-host"}) for model in ("T4", "P100"))
    elsewhere = root("sites.create", kind="shared", region="us-1")
    far = root("pools.create", siteId=elsewhere["id"], gpuModel="P100", policy=POLICY,
               **{"class": "metal-host"})
    for pool, product in ((t4, "T4-16GB"), (p100, "P100-16GB"), (far, "P100-16GB")):
        make_node(pool["id"], product=product, vram=16)
    return t4, p100, far


def either(client, pool, count, **extra):
    return client.call("reservations.create", poolId=pool["id"], duration=HOUR, devices=[
        {"class": "gpu", "count": count, "models": ["T4", "P100"]}], **extra)


def test_the_placer_picks_the_pool_where_the_request_fits_best(root):
    t4, p100, _ = two_pools(root)
    reserve(root, p100, 6)  # two GPUs left of one NVLink domain: a tight fit
    placed = either(root, t4, 2).result  # named T4 (all free), but P100 fits tighter
    assert (placed["poolId"], placed["state"]) == (p100["id"], "binding")
    reserve(root, p100, 2)  # P100 is full now
    assert either(root, t4, 2).result["poolId"] == t4["id"]


def test_a_pool_of_another_site_or_whose_quota_refuses_is_no_candidate(root, acme):
    t4, p100, far = two_pools(root)
    reserve(root, p100, 8)
    reserve(root, t4, 8)
    waiting = either(root, t4, 2).result  # full everywhere in its site: waits where named
    assert (waiting["poolId"], waiting["state"]) == (t4["id"], "pending")
    assert far["id"] not in {waiting["poolId"]}
    root("reservations.release", reservationId=waiting["id"])
    for pool in (t4, p100):
        root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 1 if pool is p100
                                                                 else 8})
    root("reservations.release", reservationId=root("reservations.list", poolId=p100["id"],
                                                    state="binding")["items"][0]["id"])
    # P100 is free again, but acme's quota there is one GPU: T4 is the only candidate left.
    asked = either(acme, t4, 2).result
    assert (asked["poolId"], asked["state"]) == (t4["id"], "pending")
    assert either(acme, p100, 1).result["poolId"] == p100["id"]  # within quota: P100 fits


def held_gpus(pool_id):
    return Quota.objects.get(tenant__slug="acme", pool_id=pool_id, resource="gpu").used


def test_a_waiting_request_is_placed_by_another_pool_it_accepts_with_its_quota(root, acme):
    t4, p100, _ = two_pools(root)
    for pool in (t4, p100):
        root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    t4_full = reserve(root, t4, 8).result
    p100_full = reserve(root, p100, 8).result
    waiting = either(acme, t4, 4).result
    only_t4 = reserve(acme, t4, 4).result  # accepts its pool's model only
    assert (waiting["state"], only_t4["state"]) == ("pending", "pending")
    assert (held_gpus(t4["id"]), held_gpus(p100["id"])) == (8, 0)
    root("reservations.release", reservationId=p100_full["id"])
    with recorded() as written:
        reconcile_pool(p100["id"])  # what a worker does when P100's GPUs free
    moved = acme("reservations.get", reservationId=waiting["id"])
    assert (moved["state"], moved["poolId"]) == ("placed", p100["id"])
    assert acme("reservations.get", reservationId=only_t4["id"])["state"] == "pending"
    assert (held_gpus(t4["id"]), held_gpus(p100["id"])) == (4, 4)  # the quota moved too
    assert written.audit == ["reservation.place"]
    place = AuditEvent.objects.get(target=waiting["id"], action="reservation.place")
    assert (place.data["fromPool"], place.data["poolId"]) == (t4["id"], p100["id"])
    assert root("reservations.get", reservationId=t4_full["id"])["state"] == "binding"


def test_a_pool_the_tenant_may_not_use_or_without_room_leaves_it_waiting(root, acme):
    t4, p100, _ = two_pools(root)
    root("pools.offer", poolId=t4["id"], to="acme", quota={"gpu": 8})
    reserve(root, t4, 8)
    waiting = either(acme, t4, 2).result  # acme has no offering on P100
    reconcile_pool(p100["id"])  # P100 is free, but not acme's to book
    assert acme("reservations.get", reservationId=waiting["id"])["poolId"] == t4["id"]
    root("pools.offer", poolId=p100["id"], to="acme", quota={"gpu": 1})
    reconcile_pool(p100["id"])  # now offered, but its quota there is one GPU
    still = Reservation.objects.get(pk=waiting["id"])
    assert (still.state, still.pool_id) == ("pending", t4["id"])
    assert (held_gpus(t4["id"]), held_gpus(p100["id"])) == (2, 0)  # nothing half-moved
    assert "P100" not in still.failure_reason  # its reason is still its own pool's


def test_a_planned_start_moves_to_now_in_another_pool_it_accepts(root):
    site = root("sites.create", kind="shared", region="eu-1")
    t4, p100 = (root("pools.create", siteId=site["id"], gpuModel=model,
                     policy={**POLICY, "sharing": {"planStarts": True}},
                     **{"class": "metal-host"}) for model in ("T4", "P100"))
    for pool, product in ((t4, "T4-16GB"), (p100, "P100-16GB")):
        make_node(pool["id"], product=product, vram=16)
    reserve(root, t4, 8, duration=2 * HOUR)
    p100_full = reserve(root, p100, 8, duration=3 * HOUR).result
    waiting = either(root, t4, 8).result
    reconcile_pool(t4["id"])
    planned = Reservation.objects.get(pk=waiting["id"])
    assert (planned.state, planned.planned, planned.pool_id) == ("placed", True, t4["id"])
    root("reservations.release", reservationId=p100_full["id"])
    reconcile_pool(p100["id"])
    now = Reservation.objects.get(pk=waiting["id"])
    assert now.pool_id == p100["id"]
    assert now.during.lower < planned.during.lower
    assert not Booking.objects.filter(allocation__reservation_id=waiting["id"],
                                      allocation__ended_at__isnull=True,
                                      device__node__pool_id=t4["id"]).exists()
    start = AuditEvent.objects.get(target=waiting["id"], action="reservation.start_earlier")
    assert start.data["fromPool"] == t4["id"]
