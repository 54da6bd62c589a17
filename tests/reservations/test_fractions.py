"""A fraction of one GPU: the fewest of the pool's time-sliced shares of one GPU that cover
it, placed on the GPU it fills best (shares pack the GPUs already shared, so whole GPUs stay
whole)."""

from __future__ import annotations

import pytest

from fleet.models import Device
from reservations.models import Booking
from tests.conftest import POLICY
from tests.factories import make_node, with_default_image
from tests.reservations.conftest import HOUR, reserve
from tests.support.ledger import overlapping_bookings


@pytest.fixture
def tenths(root):
    """A pool that slices each GPU into ten shares."""
    site = root("sites.create", kind="shared", region="eu-1")
    return with_default_image(root, root(
        "pools.create", siteId=site["id"], gpuModel="H100", **{"class": "metal-host"},
        policy={**POLICY, "timeSlicing": {"replicas": 10}}))


def fraction(client, pool, part, **device):
    return client.call("reservations.create", poolId=pool["id"], duration=HOUR,
                       devices=[{"class": "gpu-share", "fraction": part, **device}])


def gpus_of(rsv_id):
    """The indexes of the GPUs whose shares the reservation holds, and how many shares."""
    rows = Booking.objects.filter(allocation__reservation_id=rsv_id).select_related("device")
    return sorted({b.device.index for b in rows}), len(rows)


def test_a_fraction_books_the_fewest_shares_of_one_gpu_on_the_gpu_it_fills_best(root, tenths):
    make_node(tenths["id"], gpus=2, domains=(2,))
    first = fraction(root, tenths, 0.22).result
    assert first["state"] == "binding"
    assert first["devices"] == [{"class": "gpu-share", "count": 3, "topology": "same-gpu",
                                 "profile": None}]
    (gpu,), count = gpus_of(first["id"])
    assert count == 3
    # Half a GPU: the shared GPU has 7 shares free, the other 10; the shared one is filled.
    half = fraction(root, tenths, 0.5).result
    assert gpus_of(half["id"]) == ([gpu], 5)
    # 0.3 no longer fits on it (2 free): the other GPU.
    other = fraction(root, tenths, 0.3).result
    assert gpus_of(other["id"]) == ([1 - gpu], 3)
    # 0.8 of a GPU: 9 shares are free in all, but no GPU has 8: it waits.
    big = fraction(root, tenths, 0.8).result
    assert (big["state"], big["devices"][0]["count"]) == ("pending", 8)
    assert "no GPU has" not in (big.get("pendingReason") or "")  # one could: it is busy
    # An exact tenth is one share, not two (no rounding up of 0.1 * 10).
    assert gpus_of(fraction(root, tenths, 0.2).result["id"])[1] == 2
    assert overlapping_bookings() == 0


def test_a_fraction_never_takes_a_gpu_booked_whole(root, tenths):
    make_node(tenths["id"], gpus=2, domains=(2,))
    whole = reserve(root, tenths, 1).result
    whole_gpu = Booking.objects.get(allocation__reservation_id=whole["id"]).device.index
    part = fraction(root, tenths, 1.0).result
    assert gpus_of(part["id"]) == ([1 - whole_gpu], 10)
    assert fraction(root, tenths, 0.1).result["state"] == "pending"
    assert overlapping_bookings() == 0


def test_a_fraction_more_than_a_pools_shares_per_gpu_cover_is_never_split(root):
    site = root("sites.create", kind="shared", region="eu-1")
    halves = with_default_image(root, root(
        "pools.create", siteId=site["id"], gpuModel="H100", **{"class": "metal-host"},
        policy={**POLICY, "timeSlicing": {"replicas": 2}}))
    node = make_node(halves["id"], gpus=2, domains=(2,))
    assert Device.objects.filter(node=node, device_class="gpu-share").count() == 4
    # 0.3 of a GPU cut in halves is one half; three of them take both GPUs' halves, one
    # of each GPU at most two.
    placed = [fraction(root, halves, 0.3).result for _ in range(4)]
    assert [r["devices"][0]["count"] for r in placed] == [1, 1, 1, 1]
    assert {r["state"] for r in placed} == {"binding"}
    assert sorted(gpus_of(r["id"])[0][0] for r in placed) == [0, 0, 1, 1]


@pytest.mark.parametrize(("device", "field", "words"), [
    ({"class": "gpu", "fraction": 0.5}, "fraction", "only gpu-share"),
    ({"class": "gpu-share", "fraction": 0.5, "count": 2}, "fraction", "not both"),
    ({"class": "gpu-share", "fraction": 1.5}, "fraction", "1"),
    ({"class": "gpu-share", "fraction": 0}, "fraction", "0.001"),
    ({"class": "gpu-share", "count": 11, "topology": "same-gpu"}, "devices", "10 shares"),
    ({"class": "gpu", "count": 1, "topology": "same-gpu"}, "devices", "gpu-share requests"),
])
def test_a_bad_fraction_is_refused_naming_what_is_wrong(root, tenths, device, field, words):
    make_node(tenths["id"], gpus=1)
    answer = root.call("reservations.create", poolId=tenths["id"], duration=HOUR,
                       devices=[device])
    assert answer.status == 400, answer.body
    error = answer.body["error"]
    assert field in error["message"] + str(error.get("field", "")), error
    assert words in error["message"], error
    assert not Booking.objects.exists()


def test_the_cli_reserves_a_fraction_of_a_gpu(root, root_token, tenths, live_server):
    import json
    import os
    import subprocess

    make_node(tenths["id"], gpus=1)
    env = {"PATH": os.environ["PATH"], "BETTER_COMPUTE_URL": live_server.url,
           "BETTER_COMPUTE_TOKEN": root_token}

    def cli(*args):
        return subprocess.run(["better-compute", "reserve", "--pool", tenths["id"], "--for",
                               "1h", "--wait", "0", "--output", "json", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    done = cli("--fraction", "0.35")
    assert done.returncode == 0, done.stderr
    rsv = json.loads(done.stdout)
    assert rsv["devices"][0]["count"] == 4
    assert rsv["devices"][0]["topology"] == "same-gpu"
    assert gpus_of(rsv["id"]) == ([0], 4)
    both = cli("--fraction", "0.35", "--gpus", "1")
    assert both.returncode == 2
    assert "--fraction" in both.stderr
