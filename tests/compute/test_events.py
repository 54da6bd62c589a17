"""The outbox's read side: a reader paging by `seq` sees every event of its tenant exactly
once, in order, however the writers' transactions interleave."""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection, transaction

from compute.platform.events.selectors import event_list
from compute.platform.events.services import event_emit
from compute.platform.tenancy.models import Tenant
from fleet.events import FleetEvent

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_event_that_commits_after_a_later_one_comes_after_the_readers_cursor():
    tenant = Tenant.objects.create(slug="root", name="root")
    first_written, let_first_commit = threading.Event(), threading.Event()

    def slow_writer() -> None:
        try:
            with transaction.atomic():
                event_emit(tenant_id=tenant.id, type=FleetEvent.SITE_CREATED, subject="a")
                first_written.set()
                let_first_commit.wait(5)
        finally:
            connection.close()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    first_written.wait(5)
    event_emit(tenant_id=tenant.id, type=FleetEvent.POOL_CREATED, subject="b")  # commits now
    seen = event_list(tenant=tenant, types="site.*,pool.*")
    assert [e.type for e in seen] == ["pool.created"]  # what has committed, at once
    let_first_commit.set()
    thread.join()
    later = event_list(tenant=tenant, types="site.*,pool.*", since=seen[-1].position)
    assert [e.type for e in later] == ["site.created"]  # behind the row it was written before
    assert later[0].position == seen[0].position + 1


class Writers:
    """Writers whose transactions take their ids early, then write their event after a
    pause, then commit after another: ids, `seq` and commits interleave every way. One
    transaction in ten rolls back."""

    def __init__(self, tenant: Tenant, count: int, seconds: float) -> None:
        self.tenant, self.count, self.seconds = tenant, count, seconds
        self.committed: list[str] = []
        self.lock = threading.Lock()

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        deadline = time.monotonic() + self.seconds
        try:
            while time.monotonic() < deadline:
                try:
                    with transaction.atomic():
                        with connection.cursor() as cursor:
                            cursor.execute("SELECT pg_current_xact_id()")
                        time.sleep(rng.random() * 0.003)
                        event = event_emit(tenant_id=self.tenant.id, subject=f"w{seed}",
                                           type=FleetEvent.SITE_CREATED)
                        time.sleep(rng.random() * 0.003)
                        if rng.random() < 0.1:
                            raise RuntimeError("rolled back")
                except RuntimeError:
                    continue
                with self.lock:
                    self.committed.append(event.id)
        finally:
            connection.close()


def test_a_reader_paging_while_eight_writers_commit_sees_each_event_exactly_once():
    tenant = Tenant.objects.create(slug="root", name="root")
    writers = Writers(tenant, count=8, seconds=20)
    threads = [threading.Thread(target=writers.run, args=(n,)) for n in range(8)]
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def reader() -> None:
        cursor = 0
        try:
            while True:
                finished = done.is_set()  # read once more after the writers stop
                page = event_list(tenant=tenant, since=cursor, limit=1000)
                seen.extend((e.position, e.id) for e in page)
                cursor = page[-1].position if page else cursor
                if finished and not page:
                    return
        finally:
            connection.close()

    reading = threading.Thread(target=reader)
    reading.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reading.join()
    final = [(e.position, e.id) for e in event_list(tenant=tenant, limit=1000_000)]
    assert len(writers.committed) > 1000  # the writers were busy
    assert [p for p, _ in final] == list(range(1, len(final) + 1))  # no gap, no repeat
    assert sorted(i for _, i in final) == sorted(writers.committed)  # no rolled-back one
    assert seen == final  # every event once, in order
