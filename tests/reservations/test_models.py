"""A request that accepts several GPU models: the tenant's pools of the named pool's site
with one of them are candidates, and the placer's own scoring picks the pool; quotas and
offerings are checked per pool."""

from __future__ import annotations

from tests.conftest import POLICY
from tests.factories import make_node
from tests.reservations.conftest import HOUR, reserve


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
    assert (placed["poolId"], placed["state"]) == (p100["id"], "placed")
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
                                                    state="placed")["items"][0]["id"])
    # P100 is free again, but acme's quota there is one GPU: T4 is the only candidate left.
    asked = either(acme, t4, 2).result
    assert (asked["poolId"], asked["state"]) == (t4["id"], "pending")
    assert either(acme, p100, 1).result["poolId"] == p100["id"]  # within quota: P100 fits
