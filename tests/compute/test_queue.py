"""The work queue with real worker processes: one item is never processed by two workers at
once, and a worker killed with -9 has its shards taken over within a lease; nothing is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.db import connection

from compute.platform.queue.models import ShardLease, WorkItem
from compute.platform.queue.work import enqueue, shard_of
from tests.support.processes import database_url
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
LEASE = 2.0


def start_worker() -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": database_url(),
           "DJANGO_SETTINGS_MODULE": "compute.project.settings"}
    return subprocess.Popen(
        [sys.executable, "-m", "django", "bc_worker", "--loop", "--interval", "0.05",
         "--lease", str(LEASE), "--import", "tests.support.slow_handler"],
        env=env, cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture
def slow_log():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_slow_log (id bigserial PRIMARY KEY, key text, "
                       "pid int, started timestamptz, ended timestamptz)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE test_slow_log")


def overlaps() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM test_slow_log a JOIN test_slow_log b ON "
                       "a.key = b.key AND a.id < b.id AND a.pid <> b.pid AND "
                       "tstzrange(a.started, coalesce(a.ended, 'infinity')) && "
                       "tstzrange(b.started, coalesce(b.ended, 'infinity'))")
        return cursor.fetchone()[0]


def test_two_workers_share_shards_never_overlap_and_survive_kill_9(slow_log):
    keys = [f"k{n}" for n in range(40)]
    for key in keys:
        enqueue("test.slow", key)
    workers = [start_worker(), start_worker()]
    try:
        # Keep re-enqueueing the same keys while both run: each key is processed again and
        # again, and two workers would collide on it if exclusion failed.
        for _ in range(3):
            time.sleep(0.5)
            for key in keys:
                enqueue("test.slow", key)
        if not wait_until(lambda: not WorkItem.objects.exists(), 60):
            for worker in workers:
                worker.terminate()
            raise AssertionError([w.stderr.read().decode()[-2000:] for w in workers])
        owners = set(ShardLease.objects.exclude(owner="").values_list("owner", flat=True))
        assert len(owners) == 2  # the shards are shared
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(DISTINCT pid) FROM test_slow_log")
            assert cursor.fetchone()[0] == 2
        # kill -9 one worker, then queue work on its shards only.
        victim = workers[0]
        victim_shards = set(ShardLease.objects.filter(owner__endswith=f":{victim.pid}")
                            .values_list("shard", flat=True))
        assert victim_shards
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        killed_at = time.monotonic()
        orphans = [f"o{n}" for n in range(400) if shard_of("test.slow", f"o{n}")
                   in victim_shards][:10]
        for key in orphans:
            enqueue("test.slow", key)
        assert wait_until(lambda: not WorkItem.objects.exists(), 30)
        taken_over_after = time.monotonic() - killed_at
        assert taken_over_after < LEASE + 5  # within a lease (plus polling and the work)
        survivor = f":{workers[1].pid}"

        def survivor_owns_every_held_shard() -> bool:
            return all(owner.endswith(survivor) for owner in
                       ShardLease.objects.exclude(owner="").filter(expires_at__isnull=False)
                       .values_list("owner", flat=True))

        # (the orphans' shards were taken to run them; the dead worker's others within a lease)
        assert wait_until(survivor_owns_every_held_shard, LEASE + 5)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(DISTINCT key) FROM test_slow_log WHERE key = ANY(%s)",
                           [orphans])
            assert cursor.fetchone()[0] == len(orphans)  # nothing lost
        assert overlaps() == 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
                worker.wait(10)


def test_enqueue_moves_an_item_earlier_and_bumps_its_version():
    from datetime import timedelta

    from django.utils import timezone

    enqueue("test.slow", "x", due_at=timezone.now() + timedelta(hours=1))
    first = WorkItem.objects.get(kind="test.slow", key="x")
    enqueue("test.slow", "x")
    second = WorkItem.objects.get(kind="test.slow", key="x")
    assert second.due_at < first.due_at
    assert second.version == first.version + 1
    assert WorkItem.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")),
                    reason="stops and starts the embedded server; DATABASE_URL names another")
def test_a_worker_outlives_a_postgres_restart(slow_log, embedded_postgres):
    from django.db import connections

    worker = start_worker()
    try:
        enqueue("test.slow", "before")
        assert wait_until(lambda: not WorkItem.objects.exists(), 20)
        connections.close_all()
        embedded_postgres.halt()
        try:
            time.sleep(2)  # the worker meets a database that is gone, and must not exit
            alive = worker.poll() is None
        finally:
            embedded_postgres.start()  # whatever happened, the rest of the suite needs it
        assert alive, worker.stderr.read().decode()[-2000:]
        enqueue("test.slow", "after")
        assert wait_until(lambda: not WorkItem.objects.exists(), 40), "the worker gave up"
        assert worker.poll() is None
        with connection.cursor() as cursor:
            cursor.execute("SELECT array_agg(key ORDER BY id) FROM test_slow_log")
            assert cursor.fetchone()[0] == ["before", "after"]
    finally:
        worker.terminate()
        worker.wait(10)


def test_a_worker_that_starts_after_another_took_every_shard_gets_its_share():
    first = start_worker()
    second = None
    try:
        assert wait_until(lambda: ShardLease.objects.filter(
            owner__endswith=f":{first.pid}", expires_at__isnull=False).count() == 256, 30)
        second = start_worker()
        assert wait_until(lambda: ShardLease.objects.filter(
            owner__endswith=f":{second.pid}", expires_at__isnull=False).count() == 128, 30)
        assert ShardLease.objects.filter(owner__endswith=f":{first.pid}").count() == 128
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.terminate()
                worker.wait(10)
