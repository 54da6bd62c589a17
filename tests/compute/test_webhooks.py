"""Webhooks against a local receiver (a real HTTP server in the test process): signatures
that the Standard Webhooks library verifies, every event in order after the receiver was down,
dead-lettering after the limit, replay, the allowlist, and one tenant's events only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from standardwebhooks import Webhook

from audit.models import AuditEvent
from audit.sealing import SealedSecret
from compute.core.db import database_now
from compute.platform.webhooks.metrics import webhook_series
from compute.platform.webhooks.models import Delivery, Subscription
from compute.platform.webhooks.reconcilers import sweep
from tests.support.receiver import Receiver, receiving
from tests.support.work import run_due_work


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:
    settings.BC_WEBHOOK_ALLOW = "127.0.0.1/32"
    with receiving() as state:
        yield state


def deliver() -> None:
    """What the workers do: the sweep queues the subscriptions, their passes send."""
    sweep()
    run_due_work()


def backoff_passes() -> None:
    """The pending deliveries' next attempt falls due now (as waiting out the backoff would
    make it), and the workers run."""
    Delivery.objects.filter(state="pending").update(
        next_attempt_at=database_now() - timedelta(seconds=1))
    deliver()


def make_sites(api, count: int, tag: str) -> list[str]:
    return [api("sites.create", kind="shared", region=f"{tag}-{n}")["id"]
            for n in range(count)]


def test_deliveries_are_signed_as_standard_webhooks_and_the_secret_is_shown_once(
        root, receiver):
    created = root("webhooks.create", url=receiver.url, types="site.*")
    assert created["secret"].startswith("whsec_")
    assert "secret" not in root("webhooks.get", webhookId=created["id"])
    [sealed] = SealedSecret.objects.filter(pk=f"webhook:{created['id']}")
    assert created["secret"].encode() not in bytes(sealed.ciphertext)
    [site] = make_sites(root, 1, "eu")
    deliver()
    [(headers, body)] = receiver.received
    verified = Webhook(created["secret"]).verify(body, headers)  # raises if it does not
    assert (verified["type"], verified["data"]["subject"]) == ("site.created", site)
    assert headers["webhook-id"] == verified["data"]["id"]  # the event's id: the same on retry
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + "A" * 32).verify(body, headers)
    [log] = root("webhooks.deliveries", webhookId=created["id"])["items"]
    assert (log["state"], log["attempts"], log["lastStatus"]) == ("delivered", 1, 200)


def test_a_receiver_down_for_a_while_gets_every_event_in_order_after_it_recovers(
        root, receiver):
    created = root("webhooks.create", url=receiver.url, types="site.created")
    receiver.status = 503
    sites = make_sites(root, 3, "down")
    deliver()
    for _ in range(3):  # three attempts of the first one fail; nothing later is sent first
        backoff_passes()
    first = Delivery.objects.filter(subscription_id=created["id"]).order_by("position").first()
    assert (first.attempts, first.state, first.last_error) == (4, "pending", "answered 503")
    assert Delivery.objects.filter(subscription_id=created["id"], attempts=0).count() == 2
    waited = (first.next_attempt_at - database_now()).total_seconds()
    assert 6 < waited <= 8  # 1, 2, 4, then 8 s
    sites += make_sites(root, 2, "meanwhile")
    receiver.status = 200
    backoff_passes()
    subjects = [m["data"]["subject"] for m in receiver.messages()]
    assert subjects == sites
    positions = [m["data"]["seq"] for m in receiver.messages()]
    assert positions == sorted(positions)
    assert len({headers["webhook-id"] for headers, _ in receiver.received}) == 5


def test_a_delivery_is_dead_lettered_after_its_limit_the_next_go_on_and_replay_sends_it(
        root, receiver):
    created = root("webhooks.create", url=receiver.url, types="site.created", maxAttempts=2)
    receiver.status = 500
    [lost] = make_sites(root, 1, "lost")
    deliver()
    backoff_passes()
    [dead] = root("webhooks.deliveries", webhookId=created["id"], state="dead")["items"]
    assert (dead["attempts"], dead["lastStatus"]) == (2, 500)
    [family] = webhook_series()
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"tenant": "root", "state": "dead"}, 1)]  # as /metrics shows it
    assert AuditEvent.objects.filter(action="webhook.delivery.dead",
                                     target=created["id"]).count() == 1
    events = root("events.list", types="webhook.delivery.dead")["items"]
    assert [e["payload"]["deliveryId"] for e in events] == [dead["id"]]
    receiver.status = 200
    [later] = make_sites(root, 1, "later")
    deliver()
    assert [m["data"]["subject"] for m in receiver.messages()] == [later]  # it went on
    assert root("webhooks.replay", webhookId=created["id"],
                deliveryId=dead["id"]) == {"replayed": 1}
    deliver()
    assert [m["data"]["subject"] for m in receiver.messages()] == [later, lost]
    again = root("webhooks.deliveries", webhookId=created["id"])["items"]
    assert {d["state"] for d in again} == {"delivered"}
    assert root("webhooks.replay", webhookId=created["id"], since=0) == {"replayed": 2}
    deliver()
    assert [m["data"]["subject"] for m in receiver.messages()] == [later, lost, lost, later]


@pytest.mark.parametrize(("allow", "url", "why"), [
    ("public", "http://127.0.0.1:9/hooks", "127.0.0.1, a loopback address"),
    ("public", "http://localhost:9/hooks", "a loopback address"),
    ("public", "http://10.1.2.3/hooks", "10.1.2.3, a private address"),
    ("public", "http://169.254.169.254/latest", "a private address"),  # cloud metadata
    ("10.0.0.0/8", "http://[::1]:9/hooks", "::1, a loopback address"),
    ("public", "http://no-such-host.invalid/hooks", "does not resolve"),
])
def test_a_url_the_allowlist_does_not_allow_is_refused_at_subscription(root, settings, allow,
                                                                       url, why):
    settings.BC_WEBHOOK_ALLOW = allow
    refused = root.call("webhooks.create", url=url)
    assert (refused.status, refused.code) == (403, "permission_denied"), refused.body
    assert why in refused.body["error"]["message"]
    assert refused.body["error"]["message"].startswith("url: ")
    assert refused.body["error"]["details"] == {"field": "url"}
    assert not Subscription.objects.exists()


@pytest.mark.parametrize("url", ["ftp://example.com/hooks", "http://user:pw@1.1.1.1/hooks",
                                 "http:///nohost"])
def test_a_url_that_is_not_http_with_a_plain_host_is_invalid(root, url):
    refused = root.call("webhooks.create", url=url)
    assert (refused.status, refused.code) == (400, "invalid_argument"), refused.body
    assert "http:// or https://" in refused.body["error"]["message"]


def test_names_and_cidrs_the_operator_lists_are_allowed(root, settings):
    settings.BC_WEBHOOK_ALLOW = "public,*.internal.example,10.20.0.0/16"
    for url in ("http://hooks.internal.example/x", "http://10.20.3.4:8080/x",
                "https://1.1.1.1/x"):
        assert root.call("webhooks.create", url=url).status == 200, url
    refused = root.call("webhooks.create", url="http://10.21.0.1/x")
    assert refused.status == 403


def test_a_tenant_receives_its_own_events_only_and_sees_only_its_subscriptions(
        root, acme, receiver):
    mine = root("webhooks.create", url=receiver.url, types="tenant.*,site.*")
    theirs = acme("webhooks.create", url=receiver.url, types="*")
    make_sites(root, 1, "root-only")
    deliver()

    def tenants_signed_by(secret: str) -> set[str]:
        """The tenants of the messages signed with `secret` (its subscription's)."""
        found = set()
        for headers, body in receiver.received:
            try:
                found.add(Webhook(secret).verify(body, headers)["data"]["tenantId"])
            except Exception:  # noqa: S112 (another subscription's)
                continue
        return found

    assert tenants_signed_by(mine["secret"]) == {root("system.whoami")["tenantId"]}
    assert tenants_signed_by(theirs["secret"]) == {acme("system.whoami")["tenantId"]}
    assert [m["type"] for m in receiver.messages()].count("site.created") == 1
    assert [w["id"] for w in acme("webhooks.list")["items"]] == [theirs["id"]]
    hidden = acme.call("webhooks.get", webhookId=mine["id"])
    assert (hidden.status, hidden.code) == (404, "not_found")
    assert acme.call("webhooks.delete", webhookId=mine["id"]).status == 404
    acme("webhooks.delete", webhookId=theirs["id"])
    assert not SealedSecret.objects.filter(pk=f"webhook:{theirs['id']}").exists()


def test_an_unknown_type_glob_is_refused(root, receiver):
    refused = root.call("webhooks.create", url=receiver.url, types="reservaton.*")
    assert (refused.status, refused.code) == (400, "invalid_argument"), refused.body
