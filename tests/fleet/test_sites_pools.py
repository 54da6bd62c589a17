"""Sites, pools and offerings through the API: rows, events, audit, idempotency, atomicity."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from audit.models import AuditEvent
from compute.platform.events.models import Event
from fleet.models import Pool, Site
from reservations.models import Quota
from tests.support.writes import assert_wrote

POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8},
          "hostShare": {"vcpusPerGpu": 12, "memoryGiBPerGpu": 96}}


def make_pool(root, **overrides):
    site = root("sites.create", kind="shared", region="eu-1", idempotencyKey="site-eu-1")
    body = {"siteId": site["id"], "class": "metal-host", "gpuModel": "H100",
            "policy": POLICY, **overrides}
    return root("pools.create", body)


def test_site_create_writes_row_event_and_audit(root):
    with assert_wrote(audit="site.create", events=["site.created"]):
        site = root("sites.create", kind="shared", region="eu-1")
    assert Site.objects.filter(pk=site["id"]).count() == 1
    assert list(Event.objects.filter(subject=site["id"]).values_list("type", flat=True)) == [
        "site.created"]
    audit = AuditEvent.objects.get(target=site["id"])
    assert (audit.action, audit.allowed) == ("site.create", True)
    assert audit.decision_id.startswith("dec_")
    assert audit.request_id.startswith("req_")


def test_only_root_creates_platform_sites(acme):
    with assert_wrote(audit="sites.create", denied=True):
        answer = acme.call("sites.create", kind="dedicated", region="eu-1")
    assert (answer.status, answer.code) == (403, "permission_denied")
    assert not Site.objects.exists()


def test_same_idempotency_key_returns_the_same_site_once(root):
    first = root("sites.create", kind="shared", region="eu-1", idempotencyKey="site-eu-1")
    with assert_wrote(audit=None):
        second = root("sites.create", kind="shared", region="eu-1",
                      idempotencyKey="site-eu-1")
    assert first["id"] == second["id"]
    assert Site.objects.count() == 1
    assert Event.objects.filter(type="site.created").count() == 1
    assert AuditEvent.objects.filter(action="site.create").count() == 1


def test_same_key_with_other_input_is_409(root):
    root("sites.create", kind="shared", region="eu-1", idempotencyKey="k1")
    with assert_wrote(audit=None):
        answer = root.call("sites.create", kind="shared", region="eu-2", idempotencyKey="k1")
    assert (answer.status, answer.code) == (409, "idempotency_key_reused")
    assert Site.objects.count() == 1


def test_pool_key_makes_pool_create_retry_safe(root):
    with assert_wrote(audit=["site.create", "pool.create"],
                      events=["site.created", "pool.created"]):
        first = make_pool(root, idempotencyKey="pool-eu-1-h100")
    with assert_wrote(audit=None):
        second = make_pool(root, idempotencyKey="pool-eu-1-h100")
    assert first["id"] == second["id"]
    assert Pool.objects.count() == 1
    assert first["policy"] == {**POLICY, "kubernetes": False}


@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_with_one_key_make_one_site(root):
    results, barrier = [], threading.Barrier(6)

    def call():
        barrier.wait()
        try:
            results.append(root("sites.create", kind="shared", region="eu-1",
                                idempotencyKey="race")["id"])
        finally:
            connection.close()

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 6
    assert len(set(results)) == 1
    assert Site.objects.count() == 1


def test_failure_after_the_domain_row_leaves_nothing_behind(root, monkeypatch):
    from fleet.services import sites

    def fail(**kwargs):
        raise RuntimeError("outbox unavailable")

    monkeypatch.setattr(sites, "event_emit", fail)
    with assert_wrote(audit=None):
        answer = root.call("sites.create", kind="shared", region="eu-1", idempotencyKey="k")
    assert (answer.status, answer.code) == (500, "internal")
    assert not Site.objects.exists()
    assert not Event.objects.filter(type="site.created").exists()
    assert not AuditEvent.objects.filter(action="site.create").exists()


def test_pool_needs_a_gpu_model_for_metal_hosts(root):
    site = root("sites.create", kind="shared", region="eu-1")
    answer = root.call("pools.create", siteId=site["id"], **{"class": "metal-host"})
    assert answer.code == "invalid_argument"
    assert answer.body["error"]["details"]["field"] == "gpuModel"


def test_pool_in_a_site_of_another_tenant_is_not_found(root, acme):
    site = root("sites.create", kind="shared", region="eu-1")
    answer = acme.call("pools.create", siteId=site["id"], gpuModel="H100",
                       **{"class": "metal-host"})
    assert (answer.status, answer.code) == (404, "not_found")


def test_offer_gives_a_gpu_quota_and_makes_the_pool_visible(root, acme):
    pool = make_pool(root)
    assert acme.call("pools.get", poolId=pool["id"]).status == 404
    with assert_wrote(audit="pool.offer", events=["pool.offered", "offering.updated"]):
        offering = root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 16})
    assert offering["quota"] == {"gpu": {"limit": 16, "used": 0}}
    assert acme("pools.get", poolId=pool["id"])["id"] == pool["id"]
    assert [o["id"] for o in acme("offerings.list")["items"]] == [offering["id"]]
    again = root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    assert again["id"] == offering["id"]
    assert Quota.objects.get(tenant__slug="acme").limit == 8


def test_offer_refuses_a_quota_other_than_gpu_on_a_gpu_pool(root, acme):
    pool = make_pool(root)
    with assert_wrote(audit=None):
        answer = root.call("pools.offer", poolId=pool["id"], to="acme", quota={"gpus": 16})
    assert (answer.status, answer.code) == (400, "invalid_argument")
    assert "gpus" in answer.body["error"]["message"]
    assert not Quota.objects.exists()


def test_offer_to_an_unknown_tenant_is_not_found(root):
    pool = make_pool(root)
    answer = root.call("pools.offer", poolId=pool["id"], to="nobody", quota={"gpu": 1})
    assert (answer.status, answer.code) == (404, "not_found")


def test_a_tenant_cannot_offer_a_pool_it_was_offered(root, acme, globex):
    pool = make_pool(root)
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 16})
    answer = acme.call("pools.offer", poolId=pool["id"], to="globex", quota={"gpu": 16})
    assert answer.status == 404


def test_events_list_pages_by_sequence_with_a_type_glob(root):
    make_pool(root)
    events = root("events.list", types="pool.*,site.*")["items"]
    assert [e["type"] for e in events] == ["site.created", "pool.created"]
    after = root("events.list", types="pool.*", since=events[0]["seq"])["items"]
    assert [e["type"] for e in after] == ["pool.created"]
    assert root("events.list", types="node.*")["items"] == []


def test_events_are_scoped_to_the_tenant(root, acme):
    make_pool(root)
    assert acme("events.list", types="pool.*,site.*")["items"] == []
