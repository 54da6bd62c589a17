"""Sharing a pool on the real ledger: pending requests are placed by priority class, then by
fair-share factor (usage decaying with the pool's half-life), then by age; a tenant asks
only for the classes it was granted."""

from __future__ import annotations

import math
from datetime import timedelta

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from fleet.models import Pool
from reservations.models import Reservation
from reservations.sharing import fair_shares
from tests.conftest import POLICY
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.work import run_due_work
from tests.support.writes import assert_wrote


def sharing_pool(root, **sharing):
    site = root("sites.create", kind="shared", region="eu-1")
    return root("pools.create", siteId=site["id"], gpuModel="H100",
                policy={**POLICY, "sharing": sharing}, **{"class": "metal-host"})


def offer(root, pool, tenant, **extra):
    return root("pools.offer", poolId=pool["id"], to=tenant, quota={"gpu": 16}, **extra)


def used(tenant_id, pool_id, gpus, hours_ago, hours):
    """A reservation that held `gpus` GPUs for `hours`, ending `hours_ago` (usage only)."""
    end = timezone.now() - timedelta(hours=hours_ago)
    start = end - timedelta(hours=hours)
    Reservation.objects.create(tenant_id=tenant_id, pool_id=pool_id, count=gpus,
                               state="released", duration_ms=int(hours * 3_600_000),
                               during=DateTimeTZRange(start, end), placed_at=start,
                               ended_at=end)


def state(client, rsv):
    return client("reservations.get", reservationId=rsv["id"])["state"]


def test_a_higher_class_asked_later_is_placed_first(root, acme, globex):
    pool = sharing_pool(root)
    offer(root, pool, "acme")
    offer(root, pool, "globex", priorityClasses=["high", "normal"])
    make_node(pool["id"])
    blocker = reserve(root, pool, 8).result
    normal = reserve(acme, pool, 8).result
    high = reserve(globex, pool, 8, priorityClass="high").result
    assert (normal["state"], high["state"], high["priorityClass"]) == ("pending", "pending",
                                                                       "high")
    queue = root("reservations.queue", poolId=pool["id"])["items"]
    assert [(q["reservationId"], q["position"], q["aheadByPriority"]) for q in queue] == [
        (high["id"], 1, 0), (normal["id"], 2, 1)]
    assert queue[1]["why"].startswith("1 ahead (1 of a higher priority)")
    # Each tenant sees its own requests, at their place in the whole queue.
    assert [(q["reservationId"], q["position"])
            for q in acme("reservations.queue")["items"]] == [(normal["id"], 2)]
    assert [q["reservationId"] for q in globex("reservations.queue", poolId=pool["id"])[
        "items"]] == [high["id"]]
    root("reservations.release", reservationId=blocker["id"])
    with assert_wrote(audit="reservation.place", events=["reservation.placed"]):
        run_due_work()
    assert (state(globex, high), state(acme, normal)) == ("placed", "pending")


def recent_and_old_usage(root, acme, globex, half_life_hours):
    """globex used twice as many GPU-hours as acme, but hours before acme's recent hour."""
    pool = sharing_pool(root, fairShareHalfLifeHours=half_life_hours)
    offer(root, pool, "acme")
    offer(root, pool, "globex")
    used(acme.tenant_id, pool["id"], 8, hours_ago=0.5, hours=1)
    used(globex.tenant_id, pool["id"], 8, hours_ago=4, hours=2)
    return pool, fair_shares(Pool.objects.get(pk=pool["id"]), timezone.now())


def test_the_tenant_that_used_less_of_its_share_goes_first_and_old_usage_fades(root, acme,
                                                                               globex):
    # With a half-life of one hour, acme's recent hour weighs more than globex's old two.
    pool, shares = recent_and_old_usage(root, acme, globex, half_life_hours=1)
    acme_hours = 8 * (2 ** -0.5 - 2 ** -1.5) / math.log(2)
    assert math.isclose(shares[acme.tenant_id].usage_gpu_hours, acme_hours, rel_tol=0.01)
    assert shares[acme.tenant_id].factor < shares[globex.tenant_id].factor
    assert shares[pool["tenantId"]].factor == 1  # the owner used nothing

    make_node(pool["id"])
    blocker = reserve(root, pool, 8).result
    first_asked = reserve(acme, pool, 8).result
    later = reserve(globex, pool, 8).result
    queue = root("reservations.queue", poolId=pool["id"])["items"]
    assert [q["reservationId"] for q in queue] == [later["id"], first_asked["id"]]
    assert queue[1]["aheadByShare"] == 1
    root("reservations.release", reservationId=blocker["id"])
    run_due_work()
    assert (state(globex, later), state(acme, first_asked)) == ("placed", "pending")


def test_without_decay_the_same_usage_orders_the_other_way(root, acme, globex):
    _, shares = recent_and_old_usage(root, acme, globex, half_life_hours=8_000)
    assert shares[globex.tenant_id].factor < shares[acme.tenant_id].factor
    assert math.isclose(shares[globex.tenant_id].usage_gpu_hours, 16, rel_tol=0.01)


def test_a_larger_share_weighs_usage_less(root, acme, globex):
    pool = sharing_pool(root)
    offer(root, pool, "acme", share=3)
    offer(root, pool, "globex")
    used(acme.tenant_id, pool["id"], 8, hours_ago=1, hours=1)
    used(globex.tenant_id, pool["id"], 8, hours_ago=1, hours=1)
    shares = fair_shares(Pool.objects.get(pk=pool["id"]), timezone.now())
    # equal usage (U = 1/2 each); S = 3/5 against 1/5 (the owner's weight is 1)
    assert math.isclose(shares[acme.tenant_id].factor, 2 ** (-0.5 / 0.6), rel_tol=1e-3)
    assert math.isclose(shares[globex.tenant_id].factor, 2 ** (-0.5 / 0.2), rel_tol=1e-3)
    seen = acme("capacity.shares", poolId=pool["id"])
    assert [row["tenant"] for row in seen["tenants"]] == ["acme"]  # its own row only
    assert len(root("capacity.shares", poolId=pool["id"])["tenants"]) == 3


def test_a_tenant_asks_only_for_a_class_it_was_granted(root, acme):
    pool = sharing_pool(root, priorityClasses=[{"name": "urgent", "weight": 200}])
    offer(root, pool, "acme")
    make_node(pool["id"])
    with assert_wrote(audit=None):
        refused = reserve(acme, pool, 1, priorityClass="high")
    assert (refused.status, refused.code) == (400, "invalid_argument")
    assert "'high' is not granted" in refused.message
    assert "normal, preemptible" in refused.message
    unknown = reserve(acme, pool, 1, priorityClass="nightly")
    assert unknown.code == "invalid_argument"
    assert "no class 'nightly'" in unknown.message
    none = root.call("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 16},
                     priorityClasses=[])  # an offering that grants no class books nothing
    assert (none.status, none.code) == (400, "invalid_argument")
    assert "priorityClasses" in none.message
    bad = root.call("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 16},
                    priorityClasses=["nightly"])
    assert bad.code == "invalid_argument"
    assert "nightly" in bad.message
    assert reserve(root, pool, 1, priorityClass="urgent").result["priorityClass"] == "urgent"
    offer(root, pool, "acme", priorityClasses=["urgent"])
    granted = reserve(acme, pool, 1, priorityClass="urgent").result
    assert Reservation.objects.get(pk=granted["id"]).priority == 200
    assert reserve(acme, pool, 1).code == "invalid_argument"  # normal is no longer granted


def test_a_policy_class_name_is_checked(root):
    site = root("sites.create", kind="shared", region="eu-1")
    answer = root.call("pools.create", siteId=site["id"], gpuModel="H100",
                       policy={**POLICY, "sharing": {"priorityClasses": [{
                           "name": "Bad Name", "weight": 1}]}}, **{"class": "metal-host"})
    assert (answer.status, answer.code) == (400, "invalid_argument")
    assert "policy.sharing.priorityClasses[0].name" in answer.message


def test_the_cli_shows_the_queue_and_the_shares(root, root_token, acme, live_server):
    import json
    import os
    import subprocess

    pool = sharing_pool(root)
    offer(root, pool, "acme", share=2)
    make_node(pool["id"])
    reserve(root, pool, 8)
    waiting = reserve(acme, pool, 4).result
    first = reserve(root, pool, 4, priorityClass="high").result
    env = {"PATH": os.environ["PATH"], "BETTER_COMPUTE_URL": live_server.url,
           "BETTER_COMPUTE_TOKEN": root_token}

    def cli(*args):
        done = subprocess.run(["better-compute", *args], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    queue = json.loads(cli("reservations", "list", "--pending", "--pool", pool["id"],
                           "--output", "json"))["items"]
    assert [(q["reservationId"], q["position"]) for q in queue] == [(first["id"], 1),
                                                                    (waiting["id"], 2)]
    table = cli("reservations", "list", "--pending", "--output", "table")
    assert table.splitlines()[0].split()[:3] == ["POSITION", "RESERVATIONID", "POOLID"]
    shares = cli("capacity", "--pool", pool["id"], "--shares", "--output", "table")
    assert shares.splitlines()[0] == "usage counts half after 24 h"
    assert any(line.split()[:2] == ["acme", "2"] for line in shares.splitlines())
