"""The outbox's read side: a reader never skips an event that commits after a later one."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from compute.events.selectors import event_list
from compute.events.services import event_emit
from compute.events.types import EventType
from compute.tenancy.models import Tenant


@pytest.mark.django_db(transaction=True)
def test_an_event_with_a_lower_seq_committing_late_is_not_skipped():
    tenant = Tenant.objects.create(slug="root", name="root")
    first_written, let_first_commit = threading.Event(), threading.Event()

    def slow_writer() -> None:
        try:
            with transaction.atomic():
                event_emit(tenant_id=tenant.id, type=EventType.SITE_CREATED, subject="a")
                first_written.set()
                let_first_commit.wait(5)
        finally:
            connection.close()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    first_written.wait(5)
    event_emit(tenant_id=tenant.id, type=EventType.POOL_CREATED, subject="b")  # commits now
    seen = event_list(tenant=tenant, types="site.*,pool.*")
    assert seen == []  # the second waits: an older transaction is still in flight
    let_first_commit.set()
    thread.join()
    seen = event_list(tenant=tenant, types="site.*,pool.*")
    assert [e.type for e in seen] == ["site.created", "pool.created"]
    assert seen[0].seq < seen[1].seq
