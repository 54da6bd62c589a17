"""OpenID Connect on the API, against a real provider process: a JWT from the configured
issuer is a bearer token, its groups mapped to roles in tenants; a token for another
audience, an expired one, one from another issuer, a tampered one and one whose groups map to
nothing are refused."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator

import pytest

from audit.models import AuditEvent
from compute.platform.tenancy.models import OidcIdentity, RoleBinding
from tests.support.oidc import Provider, running_provider

AUDIENCE = "better-compute"
TOKEN_SECONDS = 8  # long enough for a slow machine to verify a token before it expires


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with running_provider(token_max_age=TOKEN_SECONDS) as running:
        yield running


@pytest.fixture
def oidc(settings, provider) -> Provider:
    settings.BC_OIDC_ISSUER = provider.issuer
    settings.BC_OIDC_AUDIENCE = AUDIENCE
    settings.BC_OIDC_ROLES = "gpu-ops=root:operator,ml-team=acme:member,ml-leads=acme:admin"
    settings.BC_OIDC_LEEWAY_SECONDS = 0
    settings.BC_OIDC_CLIENT_SECRET = "the-console-s-secret"  # (the provider takes any)
    return provider


def call(client, token: str, method: str, body: dict | None = None, tenant: str = ""):
    group, name = method.split(".")
    headers = {"Authorization": f"Bearer {token}"}
    return client.post(f"/api/compute/{group}/{name}", json.dumps(
        {**(body or {}), **({"tenantId": tenant} if tenant else {})}),
        content_type="application/json", headers=headers)


def test_a_token_of_the_issuer_is_a_caller_with_the_roles_its_groups_map_to(
        client, acme, oidc):
    oidc.set_user("alice", email="alice@example.com", groups=["ml-team"])
    token = oidc.tokens("alice", client_id=AUDIENCE)["id_token"]
    who = call(client, token, "system.whoami")
    assert who.status_code == 200, who.content
    principal = who.json()["result"]["principalId"]
    assert who.json()["result"]["tenantId"] == acme.tenant_id
    [identity] = OidcIdentity.objects.filter(subject="alice")
    assert (identity.principal_id, identity.issuer) == (principal, oidc.issuer)
    assert dict(RoleBinding.objects.filter(principal_id=principal).values_list(
        "tenant__slug", "role")) == {"acme": "member"}
    assert call(client, token, "reservations.list").status_code == 200  # a member's read
    refused = call(client, token, "tokens.create", {"name": "x", "role": "viewer"})
    assert refused.status_code == 403  # a member does not mint tokens
    assert AuditEvent.objects.filter(action="principal.oidc.sync",
                                     target=principal).count() == 1
    call(client, token, "system.whoami")  # the same roles: nothing written again
    assert AuditEvent.objects.filter(action="principal.oidc.sync",
                                     target=principal).count() == 1

    oidc.set_user("alice", email="alice@example.com", groups=["ml-team", "ml-leads"])
    promoted = oidc.tokens("alice", client_id=AUDIENCE)["id_token"]
    assert call(client, promoted, "tokens.create", {"name": "ci", "role": "viewer"}
                ).status_code == 200  # an admin of acme now
    assert dict(RoleBinding.objects.filter(principal_id=principal).values_list(
        "tenant__slug", "role")) == {"acme": "admin"}


def test_wrong_audience_expired_other_issuer_tampered_and_unmapped_tokens_are_refused(
        client, acme, oidc, settings):
    oidc.set_user("bob", email="bob@example.com", groups=["ml-team"])
    other = oidc.tokens("bob", client_id="another-app")["id_token"]
    answer = call(client, other, "system.whoami")
    assert answer.status_code == 401
    assert "another audience" in answer.json()["error"]["message"]

    good = oidc.tokens("bob", client_id=AUDIENCE)["id_token"]
    header, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged = base64.urlsafe_b64encode(json.dumps(
        {**claims, "groups": ["gpu-ops"]}).encode()).rstrip(b"=").decode()
    answer = call(client, f"{header}.{forged}.{signature}", "system.whoami")
    assert (answer.status_code, answer.json()["error"]["message"]) == (
        401, "the token's signature does not verify")

    settings.BC_OIDC_ISSUER = oidc.issuer + "/"  # (a trailing slash names the same one)
    assert call(client, good, "system.whoami").status_code == 200
    settings.BC_OIDC_ISSUER = "http://127.0.0.1:1"  # another issuer: its keys cannot be read
    assert call(client, good, "system.whoami").status_code == 401
    settings.BC_OIDC_ISSUER = oidc.issuer

    oidc.set_user("carol", email="carol@example.com", groups=["marketing"])
    unmapped = oidc.tokens("carol", client_id=AUDIENCE)["id_token"]
    answer = call(client, unmapped, "system.whoami")
    assert answer.status_code == 403
    assert "no group of this identity maps to a role" in answer.json()["error"]["message"]
    assert not OidcIdentity.objects.filter(subject="carol").exists()

    time.sleep(max(0.0, claims["exp"] + 1 - time.time()))  # bob's token is over
    answer = call(client, good, "system.whoami")
    assert (answer.status_code, answer.json()["error"]["message"]) == (
        401, "the token has expired")


def test_the_console_signs_in_with_the_code_flow_and_pkce_until_the_id_token_expires(
        client, acme, oidc):
    from urllib.parse import parse_qs, urlsplit

    import httpx

    oidc.set_user("dana", email="dana@example.com", groups=["ml-team"])
    assert 'id="sso"' in client.get("/console/sign-in").content.decode()
    start = client.get("/console/sign-in/oidc")
    assert start.status_code == 302
    to_issuer = urlsplit(start["Location"])
    query = parse_qs(to_issuer.query)
    assert f"{to_issuer.scheme}://{to_issuer.netloc}" == oidc.issuer
    assert (query["code_challenge_method"], query["client_id"]) == (["S256"], [AUDIENCE])
    consent = httpx.post(start["Location"], data={"sub": "dana"}, timeout=10)
    back = urlsplit(consent.headers["location"])
    assert back.path == "/console/sign-in/oidc/callback"
    replayed_elsewhere = client.get(back.path, {"state": "forged", "code": "x"})
    assert replayed_elsewhere.status_code == 401  # (and the flow is spent)
    start = client.get("/console/sign-in/oidc")  # again, for real
    consent = httpx.post(start["Location"], data={"sub": "dana"}, timeout=10)
    back = urlsplit(consent.headers["location"])
    signed_in = client.get(f"{back.path}?{back.query}")
    alert = re.findall(r"role=\"alert\">([^<]*)", signed_in.content.decode())
    assert signed_in.status_code == 302, alert
    expires_by = time.time() + TOKEN_SECONDS  # (the ID token was issued before this)
    assert signed_in["Location"] == "/console/"
    board = client.get("/console/reservations")
    assert board.status_code == 200
    assert "dana@example.com" in board.content.decode()
    answer = client.post("/api/compute/system/whoami", "{}", content_type="application/json",
                         headers={"X-Better-Compute": "1"})
    assert answer.json()["result"]["tenantId"] == acme.tenant_id
    time.sleep(max(0.0, expires_by + 1 - time.time()))  # the ID token is over: so is the session
    assert client.get("/console/reservations")["Location"] == "/console/sign-in"


@pytest.mark.parametrize("token", ["WzFd.WzFd.WzFd", "bm90.anNvbg.eA", "e30.W10.eA"])
def test_a_token_whose_parts_are_not_json_objects_is_refused_not_a_500(client, db, oidc,
                                                                       token):
    answer = call(client, token, "system.whoami")
    assert answer.status_code == 401, answer.content
    assert "not a JWT" in answer.json()["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_first_calls_of_one_identity_at_once_make_one_principal(acme, settings):
    """Eight first calls of a new identity racing on real Postgres: one principal, one
    binding, one audit row (the sync takes the identity's advisory lock)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from compute.platform.iam.oidc import Identity
    from compute.platform.tenancy.services import oidc_principal

    identity = Identity("https://idp.example", "racer", "racer@example.com",
                        {"acme": "member"}, time.time() + 60)

    def first_call(_: int) -> str:
        try:
            return oidc_principal(identity).id
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        principals = set(pool.map(first_call, range(8)))
    assert len(principals) == 1
    assert OidcIdentity.objects.filter(subject="racer").count() == 1
    assert RoleBinding.objects.filter(principal_id=principals.pop()).count() == 1
    assert AuditEvent.objects.filter(action="principal.oidc.sync").count() == 1
