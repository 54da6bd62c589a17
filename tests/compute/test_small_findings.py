"""Who sees tokens, what a token's audit row says, what a browser session must send, the
console's policy, and probes that answer 404 being audited at home."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEvent
from compute.platform.tenancy.models import Principal


def test_only_admins_list_tokens(root, acme):
    viewer = root.new_tenant("initech", role="viewer")
    answer = viewer.call("tokens.list")
    assert (answer.status, answer.code) == (403, "permission_denied")
    assert acme.call("tokens.list").status == 200


def test_a_token_for_an_existing_principal_is_audited_with_the_role_it_holds(root):
    viewer = root.new_tenant("initech", role="viewer")
    me = viewer("system.whoami")
    minted = root("tokens.create", tenantId=viewer.tenant_id, name="more",
                  principalId=me["principalId"], role="admin")
    row = AuditEvent.objects.get(action="token.create", target=minted["id"])
    assert row.data["role"] == "viewer"


@pytest.fixture
def signed_in(client, root):
    me = root("system.whoami")
    user = User.objects.create_user("ops", password="pw-123456789")
    Principal.objects.filter(pk=me["principalId"]).update(user=user)
    client.force_login(user)
    return client


@pytest.mark.parametrize(("headers", "code"), [
    ({"X-Better-Compute": "yes"}, "csrf_header_missing"),
    ({"X-Better-Compute": "1", "Origin": "https://evil.example"}, "permission_denied"),
])
def test_a_session_call_needs_the_documented_header_and_its_own_origin(signed_in, headers,
                                                                       code):
    refused = signed_in.post("/api/compute/system/whoami", data="{}",
                             content_type="application/json", headers=headers)
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, code)
    same = signed_in.post("/api/compute/system/whoami", data="{}",
                          content_type="application/json",
                          headers={"X-Better-Compute": "1", "Origin": "http://testserver",
                                   "Host": "testserver"})
    assert same.status_code == 200, same.json()


def test_console_pages_carry_a_content_security_policy(signed_in):
    page = signed_in.get("/console/")
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy


def test_a_probe_of_another_tenants_object_is_audited_in_the_callers_log(root, acme, pool):
    from tests.factories import make_node

    make_node(pool["id"])
    site = root("sites.get", siteId=pool["siteId"])
    answer = acme.call("sites.get", siteId=site["id"])
    assert (answer.status, answer.code) == (404, "not_found")
    row = AuditEvent.objects.get(allowed=False, action="sites.get")
    assert (row.tenant_id, row.target) == (acme.tenant_id, site["id"])


def test_bad_tokens_are_limited_per_source_address(api, root, settings):
    settings.BC_AUTH_FAILURE_BURST, settings.BC_AUTH_FAILURES_PER_MINUTE = 5, 10
    guesses = [api.as_token(f"biam_tok_01guess{n:020d}.x").call("system.whoami")
               for n in range(8)]
    assert [g.status for g in guesses] == [401] * 5 + [429] * 3
    throttled = root.client.post("/api/compute/system/whoami", data="{}",
                                 content_type="application/json",
                                 headers={"Authorization": "Bearer biam_tok_01guess.x"})
    assert int(throttled.headers["Retry-After"]) > 0
    assert root.call("system.whoami").status == 429  # a good token waits too: no oracle
    elsewhere = root.client.post("/api/compute/system/whoami", data="{}",
                                 content_type="application/json",
                                 headers={"Authorization": f"Bearer {root.token}"},
                                 REMOTE_ADDR="10.1.2.3")
    assert elsewhere.status_code == 200


@pytest.mark.django_db(transaction=True)
def test_calls_running_at_once_are_limited_per_tenant_across_processes(root, acme, settings):
    """Slots held by other API processes (here, other connections) count: past the tenant's,
    its calls get 429 at once, and another tenant's are served."""
    import psycopg

    from tests.support.processes import database_url

    settings.BC_CALLS_PER_TENANT = 2
    key = f"bc_calls_tenant:{acme.tenant_id}"
    others = [psycopg.connect(database_url(), autocommit=True) for _ in range(2)]
    try:
        for slot, conn in enumerate(others):  # two calls of acme running elsewhere
            assert conn.execute("SELECT pg_try_advisory_lock(hashtext(%s), %s)",
                                [key, slot]).fetchone()[0]
        refused = acme.client.post("/api/compute/system/whoami", data="{}",
                                   content_type="application/json",
                                   headers={"Authorization": f"Bearer {acme.token}"})
        assert refused.status_code == 429
        assert refused.json()["error"]["message"].startswith("at most 2 per tenant")
        assert refused.headers["Retry-After"] == "1"
        assert root.call("system.whoami").status == 200
    finally:
        for conn in others:
            conn.close()
    assert acme.call("system.whoami").status == 200  # their slots came back with them


@pytest.mark.django_db(transaction=True)
def test_every_call_gives_its_slots_back_whether_it_succeeds_or_fails(root, pool, settings):
    """Two slots per tenant and per caller: forty calls one after another, half of them
    refused (404), are all answered, and no advisory lock outlives them."""
    from django.db import connection

    settings.BC_CALLS_PER_TENANT = settings.BC_CALLS_PER_CALLER = 2
    for n in range(20):
        assert root.call("sites.get", siteId=pool["siteId"]).status == 200
        assert root.call("reservations.get",
                         reservationId=f"rsv_01jbx0000000000000000000{n:02d}").status == 404
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                       "AND pid = pg_backend_pid()")
        assert cursor.fetchone()[0] == 0
