"""Input that once made a 500: each is a 400 naming what is wrong, and nothing is stored."""

from __future__ import annotations

import asyncio
import json

import pytest

from compute.http import watch
from reservations.models import Reservation
from tests.factories import make_node

GPU = [{"class": "gpu", "count": 1}]
SELECTORS = ["product == 5", 'vramGiB == "x"', "nvlinkDomain != 3", "index > 1" + "0" * 25,
             'model == "a\x00b"', 'model == "\ud800"', "vramGiB >= 80 && product == 7"]


@pytest.fixture
def node(pool):
    return make_node(pool["id"])


@pytest.mark.parametrize("selector", SELECTORS)
@pytest.mark.parametrize("method", ["capacity.preview", "capacity.earliest",
                                    "reservations.create"])
def test_a_selector_that_does_not_fit_its_field_is_400(root, pool, node, method, selector):
    answer = root.call(method, poolId=pool["id"], duration=3_600_000, devices=GPU,
                       selector=selector)
    assert (answer.status, answer.code) == (400, "invalid_argument"), answer.body
    assert answer.body["error"]["details"]["field"] == "selector"
    assert not Reservation.objects.exists()


def test_a_series_with_such_a_selector_is_refused_and_not_stored(root, pool, node):
    from reservations.models import ReservationSeries as Series

    answer = root.call("series.create", poolId=pool["id"], devices=GPU, selector="product == 5",
                       every="weekdays 09:00-10:00", until="2027-01-08", horizonDays=366,
                       **{"from": "2027-01-04"})
    assert (answer.status, answer.code) == (400, "invalid_argument"), answer.body
    assert not Series.objects.exists()


@pytest.mark.parametrize("tenant", ["root\u0000", "\ud800", "ro ot", "root\n"])
def test_a_tenant_id_with_a_nul_or_a_lone_surrogate_is_400(root, tenant):
    body = json.dumps({"tenantId": tenant})  # \u escapes: a lone surrogate stays one
    answer = root.raw("/api/compute/system/whoami", body)
    assert (answer.status, answer.code) == (400, "invalid_argument"), answer.body
    assert answer.body["error"]["details"]["field"] == "tenantId"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("query", ["tenantId=root%00", "tenantId=%ED%A0%80", "tenantId=a%20b"])
def test_a_watch_naming_such_a_tenant_is_400(root_token, query):
    from tests.compute.test_watch import Watcher

    watcher = Watcher(root_token, query)
    asyncio.run(watch.events_watch(watcher.scope, watcher.receive, watcher.send))
    assert watcher.sent[0]["status"] == 400, watcher.body()
    assert json.loads(watcher.body())["error"]["details"]["field"] == "tenantId"


@pytest.mark.parametrize("before", ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"])
def test_earliest_before_a_time_no_window_can_end_at_is_400(root, pool, node, before):
    answer = root.call("capacity.earliest", poolId=pool["id"], duration=3_600_000, devices=GPU,
                       before=before)
    assert (answer.status, answer.code) == (400, "invalid_argument"), answer.body
    assert answer.body["error"]["details"]["field"] == "before"
