"""Limits against hoarding, per offering: each one hit, its error naming the limit and the
numbers, nothing written; the owner has none; GPUs at once count over time and hold when a
tenant's bookers race."""

from __future__ import annotations

import threading
from functools import partial

import pytest
from django.db import connections

from reservations.models import Quota, Reservation
from tests.factories import make_node
from tests.reservations.conftest import HOUR, reserve
from tests.support.ledger import run_together
from tests.support.writes import assert_wrote

DAY = 24 * HOUR


@pytest.fixture
def limited(root, pool, acme):
    """Two nodes offered to acme with 32 GPUs of quota and every limit set."""
    make_node(pool["id"])
    make_node(pool["id"])
    offering = root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 32},
                    limits={"maxDurationHours": 4, "maxStartAheadDays": 2,
                            "maxGpusAtOnce": 8})
    assert offering["limits"] == {"maxDurationHours": 4.0, "maxStartAheadDays": 2.0,
                                  "maxGpusAtOnce": 8}
    return pool


def refused_naming(answer, limit: str) -> dict:
    assert (answer.status, answer.code) == (409, "limit_exceeded"), answer.body
    assert answer.body["error"]["details"]["limit"] == limit
    assert f"limit {limit}:" in answer.body["error"]["message"]
    return answer.body["error"]


def test_a_reservation_longer_than_allowed_is_refused_and_writes_nothing(acme, limited):
    with assert_wrote(audit=None, events=[]):
        error = refused_naming(reserve(acme, limited, 1, duration=5 * HOUR),
                               "maxDurationHours")
    assert error["message"] == "limit maxDurationHours: 5 h requested, at most 4 h"
    assert (error["details"]["requested"], error["details"]["allowed"]) == (5, 4)
    assert Reservation.objects.count() == 0
    assert Quota.objects.get(tenant__slug="acme").used == 0
    assert reserve(acme, limited, 1, duration=4 * HOUR).result["state"] == "binding"


def test_a_start_further_ahead_than_allowed_is_refused(acme, limited):
    error = refused_naming(reserve(acme, limited, 1, startIn=3 * DAY), "maxStartAheadDays")
    assert error["message"] == "limit maxStartAheadDays: starts 3.0 days ahead, at most 2"
    assert reserve(acme, limited, 1, startIn=2 * DAY - HOUR).result["state"] == "placed"


def test_the_earliest_slot_stays_inside_the_booking_horizon(root, acme, limited):
    # The owner fills both nodes for the next three days; acme's horizon is two.
    for _ in range(2):
        assert reserve(root, limited, 8, duration=3 * DAY).result["state"] == "binding"
    answer = acme.call("reservations.create", poolId=limited["id"], duration=HOUR,
                       devices=[{"class": "gpu", "count": 1}], atEarliest=True)
    assert (answer.status, answer.code) == (409, "capacity_conflict"), answer.body
    assert Reservation.objects.filter(tenant__slug="acme").count() == 0
    asked = acme("capacity.earliest", poolId=limited["id"], duration=HOUR,
                 devices=[{"class": "gpu", "count": 1}])
    assert asked["found"] is False, asked  # the owner, unlimited, would get day three
    assert root("capacity.earliest", poolId=limited["id"], duration=HOUR,
                devices=[{"class": "gpu", "count": 1}])["found"] is True


def test_gpus_at_once_count_over_time(acme, limited):
    assert reserve(acme, limited, 8).result["state"] == "binding"
    assert reserve(acme, limited, 8, startIn=DAY).result["state"] == "placed"  # another day
    error = refused_naming(reserve(acme, limited, 1, startIn=HOUR // 2), "maxGpusAtOnce")
    assert error["message"] == "limit maxGpusAtOnce: 8 GPUs held then + 1 requested > 8"
    assert (error["details"]["held"], error["details"]["requested"]) == (8, 1)
    assert Reservation.objects.filter(tenant__slug="acme").count() == 2


def test_an_extension_into_held_gpus_or_past_the_length_is_refused(acme, limited):
    first = reserve(acme, limited, 4, duration=2 * HOUR).result
    # 8 at once from 2h to 3h, on other GPUs than the first's (so only the limit is in the way)
    for _ in range(2):
        assert reserve(acme, limited, 4, startIn=2 * HOUR, duration=HOUR,
                       selector="index >= 4").result["state"] == "placed"
    refused_naming(acme.call("reservations.extend", reservationId=first["id"], by=HOUR // 2),
                   "maxGpusAtOnce")
    refused_naming(acme.call("reservations.extend", reservationId=first["id"], by=3 * HOUR),
                   "maxDurationHours")
    assert acme("reservations.get", reservationId=first["id"])["durationMs"] == 2 * HOUR


def test_the_owner_has_no_limits(root, limited):
    assert reserve(root, limited, 8, duration=10 * DAY).result["state"] == "binding"
    assert reserve(root, limited, 8, startIn=30 * DAY).result["state"] == "placed"


def test_limits_are_refused_when_malformed_naming_the_field(root, pool, acme):
    answer = root.call("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 1},
                       limits={"maxGpusAtOnce": 0})
    assert answer.status == 400
    assert "maxGpusAtOnce" in str(answer.body["error"])
    answer = root.call("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 1},
                       limits={"maxHours": 5})
    assert answer.status == 400
    assert "maxHours" in str(answer.body["error"])


@pytest.mark.django_db(transaction=True)
def test_racing_bookers_of_one_tenant_never_hold_more_than_the_limit_at_once(root, pool,
                                                                            acme):
    """Six threads of acme book whole nodes over overlapping hours under maxGpusAtOnce 8,
    each thread on a node of its own (by a selector on its VRAM), so no node's lock orders
    them: at no moment do acme's reservations hold more than 8 (SQL sweep), and some were
    refused."""
    from compute.core.errors import CapacityConflict, LimitExceeded
    from compute.platform.tenancy.models import Principal, Tenant
    from reservations.services.book import reservation_create
    from reservations.shape import Shape

    for n in range(6):
        make_node(pool["id"], vram=80 + n)
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 64},
         limits={"maxGpusAtOnce": 8})
    tenant = Tenant.objects.get(slug="acme")
    actor = Principal.objects.get(pk=acme("system.whoami")["principalId"])
    gate, problems, refused = threading.Barrier(6), [], []

    def book(offset: int) -> None:
        try:
            gate.wait()
            for k in range(3):
                try:
                    reservation_create(tenant=tenant, actor=actor, pool_id=pool["id"],
                                       shape=Shape(count=8, selector=f"vramGiB == {80 + offset}"),
                                       duration_ms=2 * HOUR,
                                       start_in_ms=DAY + ((offset + k) % 3) * HOUR)
                except (LimitExceeded, CapacityConflict):
                    refused.append(offset)
        except Exception as error:
            problems.append(repr(error))
        finally:
            connections.close_all()

    run_together(*(partial(book, n) for n in range(6)))
    assert problems == []
    assert refused
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(max(held), 0) FROM (SELECT sum(d) OVER (ORDER BY at, s) AS held "
            "FROM (SELECT lower(during) AS at, 1 AS s, count AS d FROM "
            "reservations_reservation WHERE tenant_id = %s AND state = 'placed' UNION ALL "
            "SELECT upper(during), 0, -count FROM reservations_reservation "
            "WHERE tenant_id = %s AND state = 'placed') e) r", [tenant.id, tenant.id])
        assert cursor.fetchone()[0] == 8
