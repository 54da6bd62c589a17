"""A gateway that stops closes its LISTEN connection. One left open is never read again:
once notifications fill its socket, its backend blocks writing to it, holds the queue of
notifications back for every listener on the server, and stalls every DROP DATABASE there
(each waits for all backends to take its signal)."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.gateway.conftest import start_gateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def listening() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND query ILIKE 'LISTEN bc_desired%%'")
        return cursor.fetchone()[0]


def test_a_stopped_gateway_leaves_no_listening_connection(live_server, tmp_path):
    before = listening()
    running = start_gateway(live_server.url, tmp_path / "gw")
    try:
        assert wait_until(lambda: listening() == before + 1, 10)
    finally:
        running.stop()
    assert wait_until(lambda: listening() == before, 10)
