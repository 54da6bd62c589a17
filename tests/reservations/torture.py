"""The capacity torture run: concurrent bookers on a real ledger, then every invariant.

Used in-process by test_torture.py, and as a script against a scratch database (where the
EXCLUDE constraint may be dropped to prove that the checks catch overlaps):

    DATABASE_URL=… python -m tests.reservations.torture --ops 400 [--drop-exclude]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HOUR = 3_600_000
QUOTA_LIMIT = 12  # of each class of atom
SHARES = 4  # time-sliced shares per GPU
# GPUs 0-3 of a MIG node: seven 1g.10gb instances each; GPUs 4-5: two 3g.40gb each.
MIG_LAYOUT = {**{i: ["1g.10gb"] * 7 for i in range(4)}, **{i: ["3g.40gb"] * 2 for i in (4, 5)}}


@dataclass
class World:
    root: Any
    acme: Any
    root_actor: Any
    acme_actor: Any
    pool_id: str
    node_keys: dict[str, Any] = field(default_factory=dict)  # node id -> its signing key


@dataclass
class Report:
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    samples: int = 0
    quota_peak: int = 0
    quota_breaches: list[int] = field(default_factory=list)
    mended: int = 0  # stale marks of free time the menders recomputed during the run
    seconds: float = 0.0
    deadlocks: int = 0  # that Postgres detected during the run (each retried, or failed)


def build_world(*, nodes: int = 3, shares: int = SHARES) -> World:
    from cryptography.hazmat.primitives.asymmetric import ec

    from bcd.contract.crypto import public_pem
    from compute.platform.tenancy.models import Tenant
    from compute.platform.tenancy.selectors import root_tenant
    from compute.platform.tenancy.services import root_bootstrap, tenant_create, token_create
    from fleet.models import Node
    from fleet.services.images import image_create
    from fleet.services.pools import pool_create
    from fleet.services.sites import site_create
    from reservations.services.offerings import pool_offer
    from tests.factories import make_node

    admin = root_bootstrap().token.principal
    root = root_tenant()
    acme = tenant_create(actor=admin, slug=f"acme{random.randrange(10**6)}")
    acme_actor = token_create(tenant=acme, actor=admin, name="acme", role="admin").token.principal
    site = site_create(tenant=root, actor=admin, kind="shared", region="eu-1")
    # Every GPU not in MIG mode is also sliced into shares, and one node in three has
    # GPUs in MIG mode: whole GPUs, instances and shares race on the same physical GPUs.
    pool = pool_create(tenant=root, actor=admin, site_id=site.id, pool_class="metal-host",
                       gpu_model="H100",
                       policy={"hostShare": {"vcpusPerGpu": 12, "memoryGiBPerGpu": 96},
                               "timeSlicing": {"replicas": shares}})
    keys = {}
    for index in range(nodes):
        key = ec.generate_private_key(ec.SECP256R1())
        node = make_node(pool, mig=MIG_LAYOUT if index % 3 == 1 else None)
        Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
        keys[node.id] = key
    part = {"url": "https://images.example/part", "sha256": "0" * 64}
    image_create(tenant=root, actor=admin, pool_id=pool.id, name="default", kernel=part,
                 initrd=part)
    pool_offer(tenant=root, actor=admin, pool_id=pool.id, to=acme,
               quota=dict.fromkeys(("gpu", "mig", "gpu-share"), QUOTA_LIMIT))
    return World(root=root, acme=Tenant.objects.get(pk=acme.pk), root_actor=admin,
                 acme_actor=acme_actor, pool_id=pool.id, node_keys=keys)


def _one_op(world: World, rng: random.Random, mine: list[str], sandboxes: list[str],
            outcomes: Counter[str], unexpected: list[str]) -> None:
    from bcd.contract.crypto import canonical, sign_bytes
    from compute.core.errors import ComputeError
    from reservations.models import Sandbox
    from reservations.services.book import reservation_create
    from reservations.services.extend import reservation_extend
    from reservations.services.pending import pending_place
    from reservations.services.release import reservation_release
    from reservations.services.sandbox_reports import vm_report_record
    from reservations.services.sandboxes import sandbox_create, sandbox_release

    tenant, actor = ((world.acme, world.acme_actor) if rng.random() < 0.5
                     else (world.root, world.root_actor))
    roll = rng.random()
    try:
        if roll < 0.45 or not mine:
            start_in = rng.choice([0, 0, 0, rng.randrange(60_000, 3 * HOUR)])
            rsv = reservation_create(
                tenant=tenant, actor=actor, pool_id=world.pool_id,
                duration_ms=rng.randrange(HOUR // 2, 4 * HOUR), start_in_ms=start_in or None,
                shape=_atoms(rng))
            mine.append(rsv.id)
            outcomes[f"create.{rsv.state}"] += 1
        elif roll < 0.58:
            rsv_id = rng.choice(mine)
            reservation_extend(tenant=_owner(rsv_id), actor=actor, reservation_id=rsv_id,
                               by_ms=rng.choice([1, 1, -1]) * rng.randrange(60_000, HOUR))
            outcomes["extend.ok"] += 1
        elif roll < 0.95:
            # Mostly the oldest (likely placed, so capacity churns), sometimes any.
            rsv_id = mine.pop(0 if rng.random() < 0.7 else rng.randrange(len(mine)))
            rsv = reservation_release(tenant=_owner(rsv_id), actor=actor, reservation_id=rsv_id,
                                      cancel=roll > 0.88)
            outcomes[f"release.{rsv.state}"] += 1
            pending_place(pool_id=world.pool_id, limit=5)
        elif sandboxes and rng.random() < 0.6:
            # The node's side, racing the bookers: it boots, stops or loses a VM (signed).
            sandbox_id = rng.choice(sandboxes)
            sandbox = Sandbox.objects.get(pk=sandbox_id)
            if sandbox.state == "stopping" or rng.random() < 0.2:
                phase = "stopped" if sandbox.state == "stopping" else "exited"
                sandboxes.remove(sandbox_id)
            elif sandbox.state in ("placed", "starting") and rng.random() < 0.7:
                phase = "started"
            else:
                sandbox_release(tenant=world.root, actor=world.root_actor,
                                sandbox_id=sandbox_id)
                outcomes["sandbox.released"] += 1
                return
            body = canonical({"sandboxId": sandbox_id, "nodeId": sandbox.node_id,
                              "phase": phase}).decode()
            vm_report_record(node_id=sandbox.node_id, body=body, signature=sign_bytes(
                world.node_keys[sandbox.node_id], body.encode()))
            outcomes[f"sandbox.{phase}"] += 1
        else:
            sandbox = sandbox_create(tenant=world.root, actor=world.root_actor,
                                     pool_id=world.pool_id, vcpus=rng.randint(1, 4),
                                     memory_gib=rng.randint(1, 32))
            sandboxes.append(sandbox.id)
            outcomes["sandbox.created"] += 1
    except ComputeError as error:
        outcomes[f"refused.{error.code}"] += 1
    except Exception as error:  # anything else is a defect the test must show
        unexpected.append(f"{_operation(roll, bool(mine))}: {type(error).__name__}: {error}"
                          + _history_of_device(str(error)))


def _history_of_device(message: str) -> str:
    """For a booking conflict: every booking of the device named, with its reservation's
    life (state, events), so that a conflict says which operations wrote what."""
    import re

    from compute.platform.events.models import Event
    from reservations.models import Booking

    found = re.search(r"\(device_id, during\)=\((dev_[0-9a-z]+)", message)
    if found is None:
        return ""
    lines = []
    for booking in (Booking.objects.filter(device_id=found.group(1))
                    .select_related("allocation__reservation").order_by("id")):
        rsv = booking.allocation.reservation
        events = ", ".join(f"{t}@{at:%H:%M:%S.%f}" for t, at in Event.objects.filter(
            subject=rsv.id).order_by("seq").values_list("type", "created_at"))
        lines.append(f"\n  {booking.during} alloc {booking.allocation_id} (ended "
                     f"{booking.allocation.ended_at}) rsv {rsv.id} {rsv.state} {rsv.during} "
                     f"[{events}]")
    return "".join(lines)


def _operation(roll: float, booked: bool) -> str:
    """Which operation a roll of `_one_op` is (to say which one failed)."""
    if roll < 0.45 or not booked:
        return "create"
    return "extend" if roll < 0.58 else "release" if roll < 0.95 else "sandbox"


def _atoms(rng: random.Random) -> Any:
    """Whole GPUs half the time, else MIG instances or time-sliced shares."""
    from reservations.shape import Shape

    roll = rng.random()
    if roll < 0.5:
        return Shape(count=rng.choice([1, 1, 2, 2, 4, 4, 8]),
                     topology=rng.choice(["any", "any", "nvlink-all"]))
    if roll < 0.75:
        return Shape(device_class="mig", count=rng.choice([1, 2, 3]),
                     profile=rng.choice(["1g.10gb", "1g.10gb", "3g.40gb"]))
    if roll < 0.85:
        return Shape(device_class="gpu-share", count=rng.choice([1, 2, 4]))
    # A fraction of one GPU: the fewest shares of one GPU that cover it.
    return Shape(device_class="gpu-share", count=1,
                 fraction=rng.choice([0.1, 0.22, 0.25, 0.5, 0.75, 1.0]))


_OWNERS: dict[str, Any] = {}


def _owner(rsv_id: str) -> Any:
    from reservations.models import Reservation

    if rsv_id not in _OWNERS:
        _OWNERS[rsv_id] = Reservation.objects.select_related("tenant").get(pk=rsv_id).tenant
    return _OWNERS[rsv_id]


def _sample_quota(world: World, report: Report, stop: threading.Event) -> None:
    """Read, in one snapshot, the most atoms of one class acme's live reservations hold."""
    from django.db import connection, transaction

    try:
        while not stop.is_set():
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute(
                    "SELECT coalesce(max(n), 0) FROM (SELECT sum(count) AS n "
                    "FROM reservations_reservation WHERE tenant_id = %s AND state IN "
                    "('pending', 'placed', 'binding', 'active') GROUP BY device_class) held",
                    [world.acme.id])
                held = cursor.fetchone()[0]
            report.samples += 1
            report.quota_peak = max(report.quota_peak, held)
            if held > QUOTA_LIMIT:
                report.quota_breaches.append(held)
            time.sleep(0.005)
    finally:
        connection.close()


def _mend_gaps(report: Report, stop: threading.Event, counted: threading.Lock) -> None:
    """A mender of the nodes' free time, as the workers run, racing the bookers."""
    from django.db import connection

    from reservations.gaps import gaps_mend

    mended = 0
    try:
        while not stop.is_set():
            mended += gaps_mend()
            time.sleep(0.01)
    finally:
        connection.close()
        with counted:
            report.mended += mended


def run(world: World, *, clients: int = 16, ops: int = 2000, seed: int = 7) -> Report:
    from django.db import connection

    report = Report()
    per_client = ops // clients
    lists: list[list[str]] = [[] for _ in range(clients)]

    counters: list[Counter[str]] = [Counter() for _ in range(clients)]

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        sandboxes: list[str] = []
        try:
            for _ in range(per_client):
                _one_op(world, rng, lists[index], sandboxes, counters[index], report.unexpected)
        finally:
            connection.close()

    stop, counted = threading.Event(), threading.Lock()
    helpers = [threading.Thread(target=_sample_quota, args=(world, report, stop)),
               *[threading.Thread(target=_mend_gaps, args=(report, stop, counted))
                 for _ in range(2)]]
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    deadlocks_before = deadlocks_detected()
    for helper in helpers:
        helper.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    for helper in helpers:
        helper.join()
    for counter in counters:
        report.outcomes.update(counter)
    report.seconds = time.monotonic() - started
    time.sleep(1.5)  # a backend reports its counts within a second, or as it exits
    report.deadlocks = deadlocks_detected() - deadlocks_before
    return report


def deadlocks_detected() -> int:
    """Deadlocks Postgres has detected in this database, as its statistics count them."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database "
                       "WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def findings(world: World) -> dict[str, Any]:
    """Every invariant of the ledger, measured with SQL over all rows."""
    from django.db import connection
    from django.db.models import Count

    from fleet.models import Node
    from reservations.gaps import GAP_DRIFT_SQL
    from reservations.hostshare import expected_counters
    from reservations.models import Reservation
    from tests.support.ledger import OVERLAPS_SQL, PART_OVERLAPS_SQL

    def scalar(sql: str, params: list[Any] | None = None) -> Any:
        with connection.cursor() as cursor:
            cursor.execute(sql, params or [])
            return cursor.fetchone()[0]

    # Each node's counters against a recount: its live sandboxes plus the most its live GPU
    # allocations hold at one moment.
    nodes = list(Node.objects.order_by("id"))
    drift = [((node.vcpus_allocated, node.memory_gib_allocated), expected_counters(node.id))
             for node in nodes]
    return {
        "overlaps": scalar(OVERLAPS_SQL),
        # Nodes whose claims, recounted from the rows, exceed their size.
        "overSize": sum(expected[0] > node.vcpus or expected[1] > node.memory_gib
                        for node, (_counters, expected) in zip(nodes, drift, strict=True)),
        "vcpuCounterDrift": sum(counters[0] != expected[0] for counters, expected in drift),
        "memoryCounterDrift": sum(counters[1] != expected[1] for counters, expected in drift),
        "quotaDrift": scalar(
            "SELECT coalesce(sum(abs(q.used - coalesce((SELECT sum(count) FROM "
            " reservations_reservation r WHERE r.tenant_id = q.tenant_id AND "
            " r.pool_id = q.pool_id AND r.device_class = q.resource AND r.state IN "
            " ('pending', 'placed', 'binding', 'active')), 0))), 0)::int "
            "FROM reservations_quota q "
            "WHERE q.tenant_id = %s", [world.acme.id]),
        "incoherent": len(incoherent_rows()),
        "incoherentRows": incoherent_rows(),
        "partOverlaps": scalar(PART_OVERLAPS_SQL),
        # Fractions of a GPU (topology same-gpu) whose shares are not all of one GPU.
        "splitFractions": scalar(
            "SELECT count(*) FROM (SELECT a.id FROM reservations_reservation r "
            " JOIN reservations_allocation a ON a.reservation_id = r.id "
            " JOIN reservations_booking b ON b.allocation_id = a.id "
            " WHERE r.topology = 'same-gpu' GROUP BY a.id "
            " HAVING count(DISTINCT b.gpu_id) > 1) split"),
        "placedFractions": scalar("SELECT count(*) FROM reservations_reservation "
                                  "WHERE topology = 'same-gpu' AND placed_at IS NOT NULL"),
        "overlapping": overlapping_rows(),
        "exclusionConstraints": scalar(
            "SELECT array_agg(conname::text ORDER BY conname) FROM pg_constraint "
            "WHERE conrelid = 'reservations_booking'::regclass AND contype = 'x'"),
        "gapDrift": scalar(GAP_DRIFT_SQL),
        "staleGapNodes": scalar("SELECT count(DISTINCT node_id) FROM reservations_stalegaps"),
        "placedByClass": dict(Reservation.objects.filter(placed_at__isnull=False)
                              .values_list("device_class").annotate(n=Count("id"))
                              .order_by()),
        "reservations": scalar("SELECT count(*) FROM reservations_reservation"),
        "everPlaced": scalar("SELECT count(*) FROM reservations_reservation "
                             "WHERE placed_at IS NOT NULL"),
        "placedFromPending": scalar(
            "SELECT count(DISTINCT e.subject) FROM compute_event e WHERE e.type = "
            "'reservation.placed' AND EXISTS (SELECT 1 FROM compute_event p WHERE "
            "p.subject = e.subject AND p.type = 'reservation.pending')"),
    }


INCOHERENT_SQL = (
    "SELECT format('%s %s count=%s during=%s attempts=%s open=%s', r.id, r.state, r.count, "
    " r.during, r.placement_attempts, (SELECT array_agg(format('%s:%s', a.id, (SELECT "
    " array_agg(b.during::text) FROM reservations_booking b WHERE b.allocation_id = a.id))) "
    " FROM reservations_allocation a WHERE a.reservation_id = r.id AND a.ended_at IS NULL)) "
    "FROM reservations_reservation r WHERE NOT CASE "
    " WHEN r.state = 'pending' THEN NOT EXISTS (SELECT 1 FROM reservations_allocation a "
    "   WHERE a.reservation_id = r.id AND a.ended_at IS NULL) AND r.during IS NULL "
    "   OR r.placement_attempts > 0 "
    " WHEN r.state IN ('placed', 'binding', 'active') THEN "
    "   (SELECT count(*) FROM reservations_allocation a WHERE a.reservation_id = r.id "
    "    AND a.ended_at IS NULL) = 1 AND "
    "   (SELECT count(*) FROM reservations_booking b JOIN reservations_allocation a "
    "    ON a.id = b.allocation_id WHERE a.reservation_id = r.id AND a.ended_at IS NULL "
    "    AND b.during = r.during) = r.count "
    " ELSE NOT EXISTS (SELECT 1 FROM reservations_allocation a "
    "   WHERE a.reservation_id = r.id AND a.ended_at IS NULL) AND r.ended_at IS NOT NULL "
    " END LIMIT 20")


def incoherent_rows() -> list[str]:
    """Reservations whose state and rows disagree (a pending one holding an allocation, a
    placed one without exactly its bookings, an ended one still holding), each with what
    it holds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(INCOHERENT_SQL)
        return [row[0] for row in cursor.fetchall()]


def overlapping_rows() -> list[str]:
    """Every pair of bookings that overlap on one device, or on a GPU and its part, with
    what holds them: what a failed check prints."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format('%s %s %s %s/%s vs %s %s %s %s/%s', a.id, a.device_id, a.during, "
            "a.allocation_id, a.maintenance_id, b.id, b.device_id, b.during, b.allocation_id, "
            "b.maintenance_id) FROM reservations_booking a JOIN reservations_booking b "
            "ON a.id < b.id AND a.during && b.during JOIN fleet_device da ON da.id = a.device_id "
            "JOIN fleet_device db ON db.id = b.device_id "
            "WHERE a.device_id = b.device_id OR da.id = db.parent_id OR db.id = da.parent_id "
            "LIMIT 20")
        return [row[0] for row in cursor.fetchall()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--drop-exclude", action="store_true",
                        help="drop both EXCLUDE constraints (devices, and GPUs and parts)")
    parser.add_argument("--drop-gpu-exclude", action="store_true",
                        help="drop only the constraint between a GPU and its parts")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--shares", type=int, default=SHARES, help="time-sliced shares per GPU")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "compute.project.settings")
    if args.drop_exclude or args.drop_gpu_exclude:  # the services' recheck goes with them
        os.environ["BETTER_COMPUTE_LEDGER_RECHECK"] = "0"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    dropped = (["reservations_booking_device_no_overlap"] if args.drop_exclude else []) + (
        ["reservations_booking_gpu_no_overlap"]
        if args.drop_exclude or args.drop_gpu_exclude else [])
    with connection.cursor() as cursor:
        for constraint in dropped:
            cursor.execute(f"ALTER TABLE reservations_booking DROP CONSTRAINT {constraint}")
    world = build_world(nodes=args.nodes, shares=args.shares)
    report = run(world, clients=args.clients, ops=args.ops)
    print(json.dumps({"findings": findings(world), "outcomes": report.outcomes,  # noqa: T201
                      "mended": report.mended,
                      "unexpected": report.unexpected[:5], "seconds": report.seconds}))


if __name__ == "__main__":
    main()
