"""capacity.timeline, what the pool calendar draws: on a random workload its bars are the
ledger's bookings and its GPU-hours per step equal a count over the bookings (union per GPU,
read here with SQL and summed in Python); another tenant's booking is only `busy`; pending
requests sit at their planned or earliest start; measured utilisation is the mean of the
samples of booked GPUs; bad windows are 400s naming the field."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from compute.core.db import database_now
from fleet.models import Connectivity, Device, GpuSample, Node
from reservations.reconcilers import reconcile_pool
from tests.conftest import POLICY
from tests.factories import make_node
from tests.reservations.conftest import HOUR, reserve

STEP = HOUR


def timeline(client, pool, start: datetime, end: datetime, step: int | None = STEP):
    body = {"poolId": pool["id"], "from": start.isoformat(), "to": end.isoformat()}
    if step:
        body["resolution"] = step
    return client.call("capacity.timeline", body)


def ledger_rows(pool_id: str) -> list[tuple]:
    """Every booking of the pool's devices: device, physical GPU, window, holder."""
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT b.device_id, b.gpu_id, lower(b.during), upper(b.during),
                   a.reservation_id, b.maintenance_id
            FROM reservations_booking b JOIN fleet_device d ON d.id = b.device_id
            JOIN fleet_node n ON n.id = d.node_id
            LEFT JOIN reservations_allocation a ON a.id = b.allocation_id
            WHERE n.pool_id = %s AND d.present""", [pool_id])
        return cursor.fetchall()


def wire(at: datetime) -> str:
    """A time as the API writes it (UTC, to the millisecond)."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def union_seconds(windows: list[tuple[datetime, datetime]], a: datetime, b: datetime) -> float:
    """How long the union of `windows` covers [a, b)."""
    clipped = sorted((max(s, a), min(e, b)) for s, e in windows if s < b and e > a)
    total, reach = 0.0, a
    for s, e in clipped:
        s = max(s, reach)
        if e > s:
            total += (e - s).total_seconds()
            reach = e
    return total


@pytest.fixture
def shared(root, acme, pool):
    """The pool (three machines of 8 GPUs, one with MIG instances on GPU 0) offered to acme."""
    nodes = [make_node(pool["id"]), make_node(pool["id"]),
             make_node(pool["id"], mig={0: ["3g.40gb", "3g.40gb"]})]
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 24},
         priorityClasses=["normal"])
    return {"pool": pool, "nodes": nodes}


def test_a_random_workload_is_drawn_as_the_ledger_holds_it(root, acme, shared):
    pool, nodes = shared["pool"], shared["nodes"]
    rng = random.Random(51)
    booked = 0
    for _ in range(40):
        who = rng.choice([root, acme])
        answer = reserve(who, pool, rng.choice([1, 1, 2, 4]), duration=rng.randint(1, 6) * HOUR,
                         startIn=rng.randint(0, 20) * HOUR + rng.randint(0, 59) * 60_000)
        booked += answer.ok
        if answer.ok and rng.random() < 0.2:
            assert who.call("reservations.release", reservationId=answer.result["id"]).ok
    mig = Device.objects.filter(node=nodes[2], device_class="mig").first()
    assert reserve(root, pool, 1, topology="any").ok
    assert root.call("reservations.create", poolId=pool["id"], duration=2 * HOUR, devices=[
        {"class": "mig", "count": 1, "profile": mig.profile}]).ok
    assert root.call("maintenance.create", nodeId=nodes[1].id, startIn=22 * HOUR,
                     duration=3 * HOUR, reason="PSU swap").ok
    assert booked > 20
    now = database_now()
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    end = start + timedelta(hours=30)
    drawn = timeline(root, pool, start, end).result

    rows = ledger_rows(pool["id"])
    meets = [r for r in rows if r[2] < end and r[3] > start]
    assert sorted((b["deviceId"], b["start"], b["end"], b.get("reservationId"),
                   b.get("maintenanceId")) for b in drawn["bars"]) == sorted(
        (r[0], wire(r[2]), wire(r[3]), r[4], r[5]) for r in meets)

    gpus = Device.objects.filter(node__pool_id=pool["id"], device_class="gpu").count()
    held, serviced = defaultdict(list), defaultdict(list)
    for _, gpu, lower, upper, _rsv, mnt in rows:
        (serviced if mnt else held)[gpu].append((lower, upper))
    assert len(drawn["utilisation"]) == 30
    for step in drawn["utilisation"]:
        a, b = (datetime.fromisoformat(step[k]) for k in ("start", "end"))
        seconds = (b - a).total_seconds()
        want = sum(union_seconds(w, a, b) for w in held.values()) / 3600
        down = sum(union_seconds(w, a, b) for w in serviced.values()) / 3600
        assert step["allocatedGpuHours"] == pytest.approx(want, abs=1e-3), step
        assert step["gpuHours"] == pytest.approx(gpus * seconds / 3600, abs=1e-3)
        assert step["allocatableGpuHours"] == pytest.approx(gpus * seconds / 3600 - down,
                                                            abs=1e-3)
    assert any(s["allocatedGpuHours"] > 0 for s in drawn["utilisation"])
    assert any(s["allocatableGpuHours"] < s["gpuHours"] for s in drawn["utilisation"])

    # At each step's start, the GPUs the bars hold are the GPUs the ledger books then.
    parent = {r["id"]: r["parentId"] or r["id"] for r in drawn["rows"]}
    for step in drawn["utilisation"]:
        at = datetime.fromisoformat(step["start"])
        with connection.cursor() as cursor:
            cursor.execute("""
                SELECT count(DISTINCT b.gpu_id) FROM reservations_booking b
                JOIN fleet_device d ON d.id = b.device_id JOIN fleet_node n ON n.id = d.node_id
                WHERE n.pool_id = %s AND b.allocation_id IS NOT NULL AND b.during @> %s""",
                           [pool["id"], at])
            [counted] = cursor.fetchone()
        covering = {parent[b["deviceId"]] for b in drawn["bars"] if b["kind"] == "reservation"
                    and datetime.fromisoformat(b["start"]) <= at < datetime.fromisoformat(
                        b["end"])}
        assert len(covering) == counted, at


def test_rows_put_parts_under_their_gpu_and_mark_what_cannot_be_placed(root, shared):
    pool, nodes = shared["pool"], shared["nodes"]
    Node.objects.filter(pk=nodes[0].id).update(connectivity=Connectivity.UNREACHABLE)
    Device.objects.filter(node=nodes[1], index=3, parent=None).update(
        health="unhealthy", health_reason="XID 79")
    now = database_now()
    rows = timeline(root, pool, now, now + timedelta(hours=2)).result["rows"]
    assert len(rows) == 3 * 8 + 2
    by_node = defaultdict(list)
    for row in rows:
        by_node[row["nodeId"]].append(row)
    assert [r["state"] for r in by_node[nodes[0].id]] == ["unreachable"] * 8
    sick = [r for r in by_node[nodes[1].id] if r["state"] != "ok"]
    assert [(r["index"], r["state"], r["why"]) for r in sick] == [
        (3, "unhealthy", "device unhealthy: XID 79")]
    third = by_node[nodes[2].id]
    assert [r["class"] for r in third[:3]] == ["gpu", "mig", "mig"]
    assert third[1]["parentId"] == third[2]["parentId"] == third[0]["id"]
    domains = [r["nvlinkDomain"] for r in third if r["class"] == "gpu"]
    assert domains == sorted(domains)


def test_another_tenants_booking_is_busy_without_its_details(root, acme, shared):
    pool = shared["pool"]
    theirs = reserve(root, pool, 2, duration=2 * HOUR).result
    mine = reserve(acme, pool, 1, duration=2 * HOUR).result
    now = database_now()
    seen_by_acme = timeline(acme, pool, now - timedelta(hours=1), now + timedelta(hours=3))
    bars = seen_by_acme.result["bars"]
    assert sorted(b["kind"] for b in bars) == ["busy", "busy", "reservation"]
    [own] = [b for b in bars if b["kind"] == "reservation"]
    assert (own["reservationId"], own["tenant"]) == (mine["id"], "acme")
    assert set(next(b for b in bars if b["kind"] == "busy")) == {"deviceId", "start", "end",
                                                                 "kind"}
    assert theirs["id"] not in str(seen_by_acme.body)
    by_owner = timeline(root, pool, now - timedelta(hours=1), now + timedelta(hours=3)).result
    assert sorted((b["reservationId"], b["tenant"]) for b in by_owner["bars"]) == sorted(
        [(theirs["id"], "root")] * 2 + [(mine["id"], "acme")])


def test_a_pending_request_sits_at_its_earliest_start_and_a_planned_one_at_its_booking(
        root, acme, shared):
    pool = shared["pool"]
    for _ in range(3):
        assert reserve(root, pool, 8, duration=2 * HOUR).result["state"] == "binding"
    waiting = reserve(acme, pool, 4, duration=HOUR).result
    assert waiting["state"] == "pending"
    now = database_now()
    drawn = timeline(acme, pool, now - timedelta(hours=1), now + timedelta(hours=5)).result
    [pending] = drawn["pending"]
    assert (pending["reservationId"], pending["position"], pending["count"],
            pending["startFrom"]) == (waiting["id"], 1, 4, "earliest")
    blockers_end = max(datetime.fromisoformat(b["end"]) for b in drawn["bars"])
    assert datetime.fromisoformat(pending["start"]) == blockers_end
    assert len(pending["deviceIds"]) == 4
    assert {r["id"] for r in drawn["rows"]} >= set(pending["deviceIds"])
    assert pending["why"]
    assert all(b["kind"] == "busy" for b in drawn["bars"])  # acme sees root's as busy



def test_a_planned_start_is_drawn_on_the_gpus_it_booked(root):
    site = root("sites.create", kind="shared", region="eu-2")
    pool = root("pools.create", siteId=site["id"], gpuModel="H100",
                policy={**POLICY, "sharing": {"planStarts": True}}, **{"class": "metal-host"})
    make_node(pool["id"])
    holding = reserve(root, pool, 8, duration=2 * HOUR).result
    big = reserve(root, pool, 8, duration=HOUR).result
    reconcile_pool(pool["id"])
    now = database_now()
    drawn = timeline(root, pool, now - timedelta(hours=1), now + timedelta(hours=5)).result
    [planned] = drawn["pending"]
    assert (planned["reservationId"], planned["startFrom"], planned["start"]) == (
        big["id"], "planned", root("reservations.get", reservationId=holding["id"])["end"])
    assert sorted(planned["deviceIds"]) == sorted(
        b["deviceId"] for b in drawn["bars"] if b.get("reservationId") == big["id"])
    assert len(planned["deviceIds"]) == 8
    assert planned["why"].startswith("planned to start at ")


def test_measured_utilisation_is_the_mean_of_booked_gpus_samples(root, shared):
    pool = shared["pool"]
    rsv = reserve(root, pool, 1, duration=2 * HOUR).result
    booked_gpu = Device.objects.get(bookings__allocation__reservation_id=rsv["id"])
    idle_gpu = Device.objects.filter(node=booked_gpu.node, device_class="gpu").exclude(
        pk=booked_gpu.pk).first()
    now = timezone.now()
    for percent in (20, 40, 90):
        GpuSample.objects.create(device=booked_gpu, at=now, utilization=percent)
    GpuSample.objects.create(device=idle_gpu, at=now, utilization=0)  # not booked: left out
    start = now - timedelta(minutes=30)
    steps = timeline(root, pool, start, start + timedelta(hours=1),
                     step=HOUR).result["utilisation"]
    assert [(s["measuredUtilisation"], s["samples"]) for s in steps] == [(50.0, 3)]


@pytest.mark.parametrize(("body", "field"), [
    ({"to": "-1"}, "to"),  # before from
    ({"to": "+100d"}, "to"),  # longer than 92 days
    ({"resolution": 60_000, "to": "+1d"}, "resolution"),  # 1,440 steps
])
def test_a_window_it_cannot_draw_is_a_400_naming_the_field(root, shared, body, field):
    now = database_now()
    offsets = {"-1": timedelta(hours=-1), "+100d": timedelta(days=100), "+1d": timedelta(days=1)}
    sent = {"poolId": shared["pool"]["id"], "from": now.isoformat(),
            "to": (now + offsets[body["to"]]).isoformat(),
            **({"resolution": body["resolution"]} if "resolution" in body else {})}
    answer = root.call("capacity.timeline", sent)
    assert (answer.status, answer.body["error"]["details"].get("field")) == (400, field)
