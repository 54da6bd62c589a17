"""Refused calls are limited per caller: a burst, then a refill rate; past it the caller gets
429 and its probes stop filling the audit log. Allowed calls and other callers go on."""

from __future__ import annotations

from datetime import timedelta

import pytest

from audit.models import AuditEvent


@pytest.fixture
def burst(settings):
    settings.BC_REFUSAL_BURST = 5
    settings.BC_REFUSALS_PER_MINUTE = 60
    return 5


def probe(client):  # a tenant outside the caller's reach, then an action its role lacks
    return [client.call("system.whoami", tenantId="acme"),
            client.call("sites.create", kind="shared", region="eu-1")]


def denied_rows(client) -> int:
    return AuditEvent.objects.filter(tenant_id=client.tenant_id, allowed=False).count()


def test_past_its_burst_a_prober_gets_429_and_its_log_stops_growing(root, acme, burst):
    globex = root.new_tenant("globex", role="viewer")
    answers = [a for _ in range(burst) for a in probe(globex)]
    assert [(a.status, a.code) for a in answers[:burst]] == (
        [(404, "not_found"), (403, "permission_denied")] * burst)[:burst]
    throttled = answers[burst:]
    assert {(a.status, a.code) for a in throttled} == {(429, "too_many_requests")}
    assert "try again in" in throttled[0].body["error"]["message"]
    assert throttled[0].body["error"]["details"]["retryAfterSeconds"] >= 1
    again = globex.client.post("/api/compute/system/whoami", data={"tenantId": "acme"},
                               content_type="application/json",
                               headers={"Authorization": f"Bearer {globex.token}"})
    assert (again.status_code, again.headers["Retry-After"]) == (429, "1")
    # One row per refusal within the burst, one when the throttling starts, then none.
    assert denied_rows(globex) == burst + 1
    assert AuditEvent.objects.filter(tenant_id=globex.tenant_id, data__throttled=True).count() \
        == 1
    assert denied_rows(acme) == 0
    # Allowed calls are not limited; another caller is not affected.
    assert globex.call("system.whoami").status == 200
    assert acme.call("sites.create", kind="shared", region="eu-1").status == 403  # not 429


def test_the_bucket_refills_with_time(root, burst):
    from compute.platform.iam.refusals import RefusalBudget

    globex = root.new_tenant("globex", role="viewer")
    for _ in range(burst + 1):
        globex.call("sites.create", kind="shared", region="eu-1")
    assert globex.call("sites.create", kind="shared", region="eu-1").status == 429
    budget = RefusalBudget.objects.get()
    assert budget.tokens == -1  # never deeper: a throttled caller is back within a refill
    RefusalBudget.objects.update(updated_at=budget.updated_at - timedelta(seconds=3))
    again = [globex.call("sites.create", kind="shared", region="eu-1").status
             for _ in range(3)]
    assert again == [403, 403, 429]  # 3 s at one a second: two refusals back
