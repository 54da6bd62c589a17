"""The envelope: shapes, errors, authentication, the CSRF guard, one IAM decision per call."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from compute.platform.iam import _backend
from compute.platform.tenancy.models import ApiToken, Principal
from tests.support.iam import CountingIAM
from tests.support.writes import assert_wrote


@pytest.fixture
def counting_iam(settings):
    settings.BC_IAM_BACKEND = "tests.support.iam.CountingIAM"
    _backend.cache_clear()
    CountingIAM.decisions.clear()
    yield CountingIAM.decisions
    _backend.cache_clear()


def test_exactly_one_iam_decision_per_request_when_allowed_or_denied(root, counting_iam):
    site = root("sites.create", kind="shared", region="eu-1")
    pool = root("pools.create", siteId=site["id"], **{"class": "metal-host"}, gpuModel="H100")
    acme = root.new_tenant("acme", role="viewer")
    counting_iam.clear()

    answers = [
        root.call("sites.get", siteId=site["id"]),
        root.call("pools.list"),
        acme.call("sites.create", kind="shared", region="eu-2"),  # denied: not root
        acme.call("tokens.create", name="x", role="admin"),  # denied: viewer
        acme.call("system.whoami"),
        root.call("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 4}),
    ]
    assert [a.status for a in answers] == [200, 200, 403, 403, 200, 200]
    request_ids = [a.body["requestId"] for a in answers]
    assert [d[0] for d in counting_iam] == request_ids
    assert [d[2] for d in counting_iam] == [True, True, False, False, True, True]


def test_denied_call_is_audited_with_its_decision(root, counting_iam):
    from audit.models import AuditEvent

    viewer = root.new_tenant("acme", role="viewer")
    answer = viewer.call("tokens.create", name="x", role="admin")
    assert answer.code == "permission_denied"
    row = AuditEvent.objects.get(request_id=answer.body["requestId"])
    assert (row.allowed, row.action) == (False, "tokens.create")
    assert row.decision_id == answer.body["error"]["details"]["decisionId"]


def test_success_envelope_shape(root):
    answer = root.call("system.whoami")
    assert answer.status == 200
    assert set(answer.body) == {"ok", "result", "requestId"}
    assert answer.body["requestId"].startswith("req_")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "shared"}, "region"),
        ({"kind": "moon", "region": "eu-1"}, "kind"),
        ({"kind": "shared", "region": 7}, "region"),
        ({"kind": "shared", "region": "eu-1", "colour": "red"}, "colour"),
        ({"kind": "shared", "region": "eu-1", "idempotency_key": "k"}, "idempotency_key"),
    ],
)
def test_bad_input_is_400_naming_the_field(root, body, field):
    answer = root.call("sites.create", body)
    assert (answer.status, answer.code) == (400, "invalid_argument")
    assert answer.body["error"]["details"]["field"] == field
    assert field in answer.body["error"]["message"]


def test_nested_bad_input_names_the_nested_path(root):
    site = root("sites.create", kind="shared", region="eu-1")
    answer = root.call("pools.create", siteId=site["id"], gpuModel="H100",
                       policy={"acceptance": [{"kind": "diag.nvml"}, {"kind": "astrology"}]},
                       **{"class": "metal-host"})
    assert answer.code == "invalid_argument"
    assert answer.body["error"]["details"]["field"] == "policy.acceptance[1].kind"


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", "null", '"text"'])
def test_malformed_body_is_400(root, body):
    answer = root.raw("/api/compute/system/whoami", body)
    assert (answer.status, answer.code) == (400, "invalid_argument")


def test_non_json_content_type_is_400(root):
    answer = root.raw("/api/compute/system/whoami", "a=b",
                      content_type="application/x-www-form-urlencoded")
    assert (answer.status, answer.code) == (400, "invalid_argument")


def test_wrong_id_prefix_is_invalid_argument(root):
    answer = root.call("sites.get", siteId="pool_01jbx0000000000000000000000")
    assert answer.code == "invalid_argument"
    assert answer.body["error"]["details"]["field"] == "siteId"


def test_unknown_method_is_404(root):
    answer = root.call("sites.explode")
    assert (answer.status, answer.code) == (404, "not_found")


@pytest.mark.parametrize(
    "header",
    ["", "Basic abc", "Bearer ", "Bearer biam_nope", "Bearer biam_tok_x.y", "Bearer tok_x.y"],
)
def test_missing_or_malformed_credentials_are_401(api, db, header):
    headers = {"Authorization": header} if header else {}
    answer = api.raw("/api/compute/system/whoami", "{}", **headers)
    assert (answer.status, answer.code) == (401, "unauthenticated")


def test_wrong_secret_is_401(root, root_token):
    forged = root_token[:-4] + ("AAAA" if not root_token.endswith("AAAA") else "BBBB")
    assert root.as_token(forged).call("system.whoami").status == 401


def test_revoked_token_is_401(root):
    with assert_wrote(audit="token.create", events=["token.created"]):
        minted = root("tokens.create", name="ci", role="viewer")
    client = root.as_token(minted["token"])
    assert client.call("system.whoami").status == 200
    with assert_wrote(audit="token.revoke", events=["token.revoked"]):
        root("tokens.revoke", tokenId=minted["id"])
    answer = client.call("system.whoami")
    assert (answer.status, answer.code) == (401, "unauthenticated")
    assert "revoked" in answer.body["error"]["message"]


def test_expired_token_is_401(root):
    minted = root("tokens.create", name="short", role="viewer", ttl=60_000)
    client = root.as_token(minted["token"])
    assert client.call("system.whoami").status == 200
    ApiToken.objects.filter(pk=minted["id"]).update(expires_at=timezone.now() - timedelta(1))
    answer = client.call("system.whoami")
    assert (answer.status, answer.code) == (401, "unauthenticated")


def test_token_secret_is_stored_hashed(root):
    minted = root("tokens.create", name="ci", role="viewer")
    secret = minted["token"].split(".", 1)[1]
    row = ApiToken.objects.get(pk=minted["id"])
    assert secret not in row.secret_sha256
    assert len(row.secret_sha256) == 64
    listed = root("tokens.list")["items"]
    assert minted["id"] in [t["id"] for t in listed]
    assert "token" not in json.dumps(listed).replace('"tokens"', "")


def test_session_request_needs_the_csrf_header(client, root):
    me = root("system.whoami")
    user = User.objects.create_user("ops", password="pw-123456789")
    Principal.objects.filter(pk=me["principalId"]).update(user=user)
    client.force_login(user)
    without = client.post("/api/compute/system/whoami", data="{}",
                          content_type="application/json")
    assert without.status_code == 403
    assert without.json()["error"]["code"] == "csrf_header_missing"
    with_header = client.post("/api/compute/system/whoami", data="{}",
                              content_type="application/json",
                              headers={"X-Better-Compute": "1"})
    assert with_header.status_code == 200
    assert with_header.json()["result"]["principalId"] == me["principalId"]


def test_unexpected_exception_is_500_without_a_stack_trace(root, monkeypatch):
    from compute.core.api import registry

    endpoint = registry.REGISTRY[("system", "whoami")]

    def explode(ctx, data):
        raise RuntimeError("secret internals")

    monkeypatch.setitem(registry.REGISTRY, ("system", "whoami"),
                        type(endpoint)(**{**endpoint.__dict__, "handler": explode}))
    answer = root.call("system.whoami")
    assert (answer.status, answer.code) == (500, "internal")
    assert "secret internals" not in json.dumps(answer.body)
    assert "Traceback" not in json.dumps(answer.body)


def test_get_on_the_envelope_is_405_in_envelope_shape(client, db):
    response = client.get("/api/compute/system/whoami")
    assert response.status_code == 405
    assert response.json()["ok"] is False


@pytest.mark.parametrize("tenant", [7, ["root"], "x" * 64])
def test_a_tenant_id_of_the_wrong_shape_is_400(root, tenant):
    answer = root.call("system.whoami", tenantId=tenant)
    assert (answer.status, answer.code) == (400, "invalid_argument")
    assert answer.body["error"]["details"]["field"] == "tenantId"


@pytest.mark.parametrize(("body", "status", "code", "says"), [
    ('{"kind": "shared", "region": "eu-1", "name": "a\\u0000b"}', 400, "invalid_argument",
     "NUL"),
    ("[" * 100_000 + "]" * 100_000, 400, "invalid_argument", "nested too deeply"),
    ('{"kind": "shared", "region": "eu-1", "name": "' + "x" * 4_200_000 + '"}', 413,
     "payload_too_large", "larger than 4194304 bytes"),
])
def test_hostile_bodies_get_a_4xx_naming_the_problem(root, body, status, code, says):
    answer = root.raw("/api/compute/sites/create", body)
    assert (answer.status, answer.code) == (status, code), answer.body
    assert says in answer.body["error"]["message"]


@pytest.mark.parametrize("body", ["", "   "])
def test_a_missing_body_is_400_as_the_document_says(root, body):
    answer = root.raw("/api/compute/system/whoami", body)  # a method with no required field
    assert (answer.status, answer.code) == (400, "invalid_argument"), answer.body
    assert "({} when there is nothing to send)" in answer.body["error"]["message"]
    assert root.raw("/api/compute/system/whoami", "{}").status == 200


def test_a_start_beyond_the_horizon_is_400_not_an_overflow(root, pool):
    from tests.factories import make_node

    make_node(pool["id"])
    answer = root.call("reservations.create", poolId=pool["id"], duration=3_600_000,
                       devices=[{"class": "gpu", "count": 1}], start="9999-12-31T23:59:59Z")
    assert (answer.status, answer.code) == (400, "invalid_argument")
    assert answer.body["error"]["details"]["field"] == "start"
    preview = root.call("capacity.preview", poolId=pool["id"], duration=3_600_000,
                        devices=[{"class": "gpu", "count": 1}], start="9999-12-31T23:59:59Z")
    assert (preview.status, preview.code) == (400, "invalid_argument")


def test_bootstrap_and_tenant_creation_write_one_row_each(db):
    from compute.platform.tenancy.services import root_bootstrap

    with assert_wrote(audit="root.bootstrap", events=["token.created"]):
        minted = root_bootstrap()
    assert minted.plaintext.startswith("biam_tok_")


def test_a_tenant_create_writes_its_row_and_a_repeat_slug_nothing(root):
    with assert_wrote(audit="tenant.create", events=["tenant.created"]):
        root("tenants.create", slug="initech")
    with assert_wrote(audit=None):
        assert root.call("tenants.create", slug="initech").code == "already_exists"
