"""Bookers who all prefer one node do not queue for it: while another booker holds the best
node, a booking takes the next best at once; when every fitting node is held it waits for
the best, and is placed (never left pending because of a lock)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connections

from reservations.models import Allocation
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.reservations.test_group_gaps import waiting
from tests.support.processes import database_url
from tests.support.waiting import wait_until


def holding(url: str, node_id: str) -> psycopg.Connection:
    """Another booker's transaction, holding the node's row."""
    conn = psycopg.connect(url)
    conn.execute("SELECT id FROM fleet_node WHERE id = %s FOR UPDATE", [node_id])
    return conn


def booking(root, pool) -> tuple[threading.Thread, list[dict]]:
    """A reservation of one GPU being made on a thread of its own; its result when done."""
    results: list[dict] = []

    def book() -> None:
        try:
            results.append(reserve(root, pool, 1).result)
        finally:
            connections.close_all()

    booker = threading.Thread(target=book)
    booker.start()
    return booker, results


def booked_node(result: dict) -> str:
    return Allocation.objects.get(reservation_id=result["id"]).node_id


@pytest.mark.django_db(transaction=True)
def test_a_booker_takes_the_next_node_while_the_best_is_held(root, pool):
    best, second = sorted([make_node(pool["id"]), make_node(pool["id"])], key=lambda n: n.id)
    assert booked_node(reserve(root, pool, 1).result) == best.id  # the placer's choice
    with holding(database_url(), best.id):  # held until the end of this block, never committed
        booker, results = booking(root, pool)
        booker.join(20)
        done = not booker.is_alive()
    booker.join(20)
    assert done, "the booker waited for the held node"
    assert results[0]["state"] == "binding"
    assert booked_node(results[0]) == second.id
    assert booked_node(reserve(root, pool, 1).result) == best.id  # packing again once free


@pytest.mark.django_db(transaction=True)
def test_a_booker_waits_for_the_best_when_every_fitting_node_is_held(root, pool):
    node = make_node(pool["id"])
    url = database_url()
    holder = holding(url, node.id)
    try:
        booker, results = booking(root, pool)
        assert wait_until(lambda: any(waiting(url, pid) for pid in backends(url)), 10)
        assert results == []  # it waits rather than leaving the request pending
    finally:
        holder.commit()
        holder.close()
        booker.join(20)
    assert results
    assert results[0]["state"] == "binding"
    assert booked_node(results[0]) == node.id


def backends(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as watch:
        return [pid for (pid,) in watch.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")]
