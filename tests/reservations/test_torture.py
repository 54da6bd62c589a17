"""The capacity torture test: 16 concurrent bookers, 2,000 mixed operations, real Postgres.

Then, by SQL over every row: no overlapping bookings, quota never exceeded (a concurrent
sampler watched it), host counters equal to the sum of what is live, every reservation in
a coherent state. A second run on a scratch database without the EXCLUDE constraint must
find overlaps: proof that the checks can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.conf import settings

from reservations.gaps import gaps_mend
from tests.reservations import torture
from tests.support.processes import database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_concurrent_bookers_never_double_book_or_exceed_quota():
    from reservations.models import Booking

    assert not Booking.objects.exists()  # a clean ledger: every row below is this run's
    world = torture.build_world(nodes=4)
    report = torture.run(world, clients=16, ops=2000)
    assert report.unexpected == [], "\n".join(report.unexpected)
    # Every service takes its locks in the ledger's order (quota, node, then its bookings;
    # a pool's work item last): bookers wait for each other, never in a cycle.
    assert report.deadlocks == 0
    found = torture.findings(world)
    assert found["exclusionConstraints"] == ["reservations_booking_device_no_overlap",
                                             "reservations_booking_gpu_no_overlap"]
    assert found["overlaps"] == 0, found["overlapping"]
    assert found["overSize"] == 0  # no node's claims exceed its vCPUs or memory
    assert found["partOverlaps"] == 0
    assert found["splitFractions"] == 0, found
    assert found["placedFractions"] > 5, found
    # The free time of whole groups, mended while the bookers raced, is right on every
    # node not marked stale; once the last marks are mended, on every node.
    assert report.mended > 100
    assert found["gapDrift"] == 0
    gaps_mend()
    assert torture.findings(world)["gapDrift"] == 0
    assert torture.findings(world)["staleGapNodes"] == 0
    # Whole GPUs, MIG instances and shares were all placed, on the same physical GPUs.
    assert min(found["placedByClass"].get(kind, 0) for kind in ("gpu", "mig", "gpu-share")) \
        > 20, found["placedByClass"]
    assert found["vcpuCounterDrift"] == 0
    assert found["memoryCounterDrift"] == 0
    assert found["quotaDrift"] == 0
    assert found["incoherent"] == 0, found["incoherentRows"]
    assert report.quota_breaches == []
    assert report.samples > 20
    assert report.quota_peak <= torture.QUOTA_LIMIT
    outcomes = report.outcomes
    assert sum(outcomes.values()) == 2000
    # Not vacuous: requests collided, waited, were refused and were placed.
    assert found["everPlaced"] > 80
    assert found["placedFromPending"] > 5
    assert outcomes["create.pending"] > 10
    assert outcomes["refused.quota_exceeded"] > 10
    assert outcomes["refused.capacity_conflict"] + outcomes["refused.invalid_state"] > 0
    assert outcomes["extend.ok"] > 10
    assert outcomes["release.released"] + outcomes["release.cancelled"] > 100
    # Sandboxes raced on the same host counters, with their nodes' signed reports.
    for done in ("sandbox.created", "sandbox.started", "sandbox.released", "sandbox.stopped",
                 "sandbox.exited"):
        assert outcomes[done] > 0, (done, outcomes)


@pytest.mark.parametrize("shares", [1, pytest.param(3, marks=pytest.mark.campaign),
                                    pytest.param(7, marks=pytest.mark.campaign), 10])
def test_shares_of_one_to_ten_per_gpu_never_overlap(shares):
    """The same race on pools slicing each GPU into 1 to 10 shares: whole GPUs, MIG
    instances, counted shares and fractions of one GPU on the same physical GPUs."""
    world = torture.build_world(nodes=2, shares=shares)
    report = torture.run(world, clients=8, ops=300, seed=shares)
    assert report.unexpected == [], "\n".join(report.unexpected)
    assert report.deadlocks == 0
    found = torture.findings(world)
    assert (found["overlaps"], found["partOverlaps"], found["splitFractions"]) == (0, 0, 0), \
        found["overlapping"]
    assert found["incoherent"] == 0, found["incoherentRows"]
    assert found["quotaDrift"] == 0
    assert found["placedByClass"].get("gpu-share", 0) > 5, found["placedByClass"]
    assert found["placedFractions"] > 0, found


@pytest.fixture
def scratch_url():
    """A database of its own, dropped afterwards: a copy of the migrated (and, between
    transactional tests, empty) test database when no other session holds that one (a
    template must have none), else an empty one the torture migrates."""
    from django.db import connections

    name = f"scratch_{uuid.uuid4().hex[:8]}"
    connections.close_all()
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        try:
            conn.execute(
                f'CREATE DATABASE "{name}" TEMPLATE "{settings.DATABASES["default"]["NAME"]}"')
        except psycopg.errors.ObjectInUse:  # threads of earlier tests keep their sessions
            conn.execute(f'CREATE DATABASE "{name}"')
    yield database_url(name)
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute("SET statement_timeout = '60s'")
        try:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        except psycopg.errors.QueryCanceled:
            # The drop waits for every backend on the server to take its signal; one that
            # is blocked writing to a client that no longer reads never does.
            blocked = conn.execute(
                "SELECT pid, datname, wait_event, left(query, 60) FROM pg_stat_activity "
                "WHERE wait_event = 'ClientWrite'").fetchall()
            pytest.fail(f"DROP DATABASE waited 60 s; backends blocked writing: {blocked}")


def _torture_without(scratch_url: str, flag: str) -> dict:
    env = {**os.environ, "DATABASE_URL": scratch_url,
           "DJANGO_SETTINGS_MODULE": "compute.project.settings"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.reservations.torture", "--ops", "600", flag],
        env=env, capture_output=True, text=True, timeout=300, check=False,
        cwd=settings.BASE_DIR)
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict = json.loads(result.stdout.strip().splitlines()[-1])["findings"]
    return found


def test_without_the_exclude_constraints_the_checks_find_overlaps(scratch_url):
    assert _torture_without(scratch_url, "--drop-exclude")["overlaps"] > 0


def test_without_the_gpu_and_parts_constraint_whole_gpus_overlap_their_parts(scratch_url):
    """The placer reads bookings correctly, so only racing bookers can break the rule; the
    constraint between a GPU and its parts is what stops them."""
    assert _torture_without(scratch_url, "--drop-gpu-exclude")["partOverlaps"] > 0
