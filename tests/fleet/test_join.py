"""JoinService through its HTTP relay, with the agent's real join code."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from django.utils import timezone

from audit.models import AuditEvent
from bcd.contract.crypto import jwe_seal, jwk_public_key
from bcd.join.documents import JoinError, JoinRequest, Pins, check_wellknown, prepare, verify_answer
from compute.platform.iam import _backend
from fleet.models import JoinToken, Node
from tests.support.iam import CountingIAM
from tests.support.writes import assert_wrote

HARDWARE = {"hostname": "gpu-01", "serial": "SN-7701", "productUuid": "4c4c4544-0001",
            "macs": ["aa:bb:cc:dd:ee:01"]}


@pytest.fixture
def pool(root):
    site = root("sites.create", kind="shared", region="eu-1")
    return root("pools.create", siteId=site["id"], gpuModel="H100", **{"class": "metal-host"})


@pytest.fixture
def wellknown(client, db):
    return client.get("/.well-known/better-compute").json()


@pytest.fixture
def pins(root, wellknown):
    shown = root("pki.show")
    return Pins(shown["servingCaSpkiPin"], shown["joinSigningKeyPin"],
                shown["joinEncryptionKeyPin"])


def join(client, token, wellknown, hardware=HARDWARE, request=None):
    request = request or prepare(token, wellknown, hardware["hostname"])
    response = client.post("/api/agent/join", content_type="application/json", data=json.dumps({
        "sealedToken": request.sealed_token, "csr": base64.b64encode(request.csr_der).decode(),
        "hardware": hardware}))
    return request, response.status_code, response.json()


def mint(root, pool, **extra):
    return root("joinTokens.create", poolId=pool["id"], ttl=7_200_000, **extra)


def test_a_machine_joins_and_gets_a_24h_spiffe_certificate(client, root, pool, wellknown, pins):
    minted = mint(root, pool, expectSerial="SN-7701")
    assert minted["token"].startswith("bcjt_jtk_")
    check_wellknown(wellknown, pins)
    with assert_wrote(audit="node.join", events=["node.joined"]):  # one row, not two
        request, status, body = join(client, minted["token"], wellknown)
    assert status == 200, body
    payload = verify_answer(body["result"], request, pins, wellknown["trustDomain"])
    node = Node.objects.get(pk=payload["nodeId"])
    assert (node.provision_state, node.pool_id, node.serial) == ("adopting", pool["id"],
                                                                "SN-7701")
    cert = x509.load_pem_x509_certificate(payload["certificatePem"].encode())
    lifetime = cert.not_valid_after_utc - datetime.now(UTC)
    assert timedelta(hours=23, minutes=50) < lifetime <= timedelta(hours=24)
    assert payload["spiffeId"] == (f"spiffe://{wellknown['trustDomain']}/site/"
                                   f"{node.site_id}/node/{node.id}")
    assert JoinToken.objects.get(pk=minted["id"]).uses == 1
    types = [e["type"] for e in root("nodes.events", nodeId=node.id)["items"]]
    assert types == ["node.joined"]


def reseal(request, token, wellknown, csr_der=None):
    """The same key and CSR with the token sealed again, as a retrying agent does."""
    csr_der = csr_der or request.csr_der
    sealed = jwe_seal(token.encode(), jwk_public_key(wellknown["joinEncryptionKey"]),
                      {"csr_sha256": hashlib.sha256(csr_der).hexdigest()})
    return JoinRequest(key=request.key, csr_der=request.csr_der, sealed_token=sealed)


def test_a_second_join_of_the_same_machine_spends_nothing(client, root, pool, wellknown, pins):
    minted = mint(root, pool, maxUses=1)
    request, _, first = join(client, minted["token"], wellknown)
    with assert_wrote(audit="node.join"):  # the same node again: no node.joined event
        _, status, second = join(client, minted["token"], wellknown,
                                 request=reseal(request, minted["token"], wellknown))
    assert status == 200
    first_node = verify_answer(first["result"], request, pins, wellknown["trustDomain"])
    second_node = verify_answer(second["result"], request, pins, wellknown["trustDomain"])
    assert first_node["nodeId"] == second_node["nodeId"]
    assert JoinToken.objects.get(pk=minted["id"]).uses == 1
    assert Node.objects.count() == 1


def test_a_token_sealed_for_another_csr_is_refused(client, root, pool, wellknown):
    minted = mint(root, pool)
    request = prepare(minted["token"], wellknown, "gpu-01")
    forged = reseal(request, minted["token"], wellknown, csr_der=b"another csr")
    _, status, _ = join(client, minted["token"], wellknown, request=forged)
    assert status == 403
    assert JoinToken.objects.get(pk=minted["id"]).uses == 0


REFUSALS = {
    "wrong secret": lambda t, root: t["token"][:-3] + "xyz",
    "revoked": lambda t, root: (root("joinTokens.revoke", joinTokenId=t["id"]), t["token"])[1],
    "expired": lambda t, root: (JoinToken.objects.filter(pk=t["id"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)), t["token"])[1],
    "no uses left": lambda t, root: (JoinToken.objects.filter(pk=t["id"]).update(uses=1),
                                     t["token"])[1],
    "not a token": lambda t, root: "hello",
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_refusal_looks_the_same_and_only_audit_says_why(client, root, pool, wellknown,
                                                              case):
    minted = mint(root, pool)
    token = REFUSALS[case](minted, root)
    with assert_wrote(audit="node.join", denied=True):
        _, status, body = join(client, token, wellknown)
    body.pop("requestId")
    assert (status, body) == (403, {"ok": False, "error": {
        "code": "join_refused", "message": "join refused", "details": {}}})
    refused = AuditEvent.objects.filter(action="node.join", allowed=False).latest("seq")
    assert refused.reason
    assert not Node.objects.exists()


@pytest.mark.parametrize(("binding", "hardware"), [
    ({"expectSerial": "SN-1"}, HARDWARE),
    ({"expectProductUuid": "other-uuid"}, HARDWARE),
    ({"expectMac": "aa:bb:cc:dd:ee:99"}, HARDWARE),
    ({}, {**HARDWARE, "serial": "", "productUuid": ""}),
])
def test_binding_and_hardware_identity_are_enforced(client, root, pool, wellknown, binding,
                                                    hardware):
    minted = mint(root, pool, **binding)
    _, status, body = join(client, minted["token"], wellknown, hardware=hardware)
    assert status == 403
    assert body["error"]["code"] == "join_refused"
    assert JoinToken.objects.get(pk=minted["id"]).uses == 0


def test_a_machine_without_hardware_ids_joins_with_a_mac_binding(client, root, pool, wellknown):
    minted = mint(root, pool, expectMac="AA:BB:CC:DD:EE:01")
    _, status, _ = join(client, minted["token"], wellknown,
                        hardware={**HARDWARE, "serial": "", "productUuid": ""})
    assert status == 200


def test_a_token_sealed_to_another_key_is_refused(client, root, pool, wellknown):
    from cryptography.hazmat.primitives.asymmetric import ec

    from bcd.contract.crypto import public_jwk

    minted = mint(root, pool)
    other = {**wellknown, "joinEncryptionKey": public_jwk(
        ec.generate_private_key(ec.SECP256R1()).public_key())}
    _, status, _ = join(client, minted["token"], other)
    assert status == 403


def test_the_agent_refuses_a_wellknown_document_with_other_pins(wellknown, pins):
    bad = Pins(pins.serving_ca, pins.join_signing, "sha256/" + "A" * 43 + "=")
    with pytest.raises(JoinError, match="joinEncryptionKeyPin"):
        check_wellknown(wellknown, bad)


def test_the_join_path_never_calls_iam(client, root, pool, wellknown, settings):
    minted = mint(root, pool)
    settings.BC_IAM_BACKEND = "tests.support.iam.CountingIAM"
    _backend.cache_clear()
    CountingIAM.decisions.clear()
    try:
        join(client, minted["token"], wellknown)
        join(client, "bcjt_bad.token", wellknown)
        assert CountingIAM.decisions == []
    finally:
        _backend.cache_clear()


def test_join_token_ttl_bounds_and_secrets_never_listed(root, pool):
    assert root.call("joinTokens.create", poolId=pool["id"], ttl=30_000).code == \
        "invalid_argument"
    assert root.call("joinTokens.create", poolId=pool["id"], ttl=25 * 3_600_000).code == \
        "invalid_argument"
    with assert_wrote(audit="join_token.create", events=["join_token.created"]):
        minted = mint(root, pool)
    spare = mint(root, pool)
    with assert_wrote(audit="join_token.revoke", events=["join_token.revoked"]):
        root("joinTokens.revoke", joinTokenId=spare["id"])
    with assert_wrote(audit=None):
        assert root.call("joinTokens.revoke", joinTokenId=spare["id"]).code == "invalid_state"
    listed = root("joinTokens.list")["items"]
    assert [t["id"] for t in listed] == [minted["id"], spare["id"]]
    assert minted["token"].split(".")[1] not in json.dumps(listed)
    row = JoinToken.objects.get(pk=minted["id"])
    assert minted["token"].split(".")[1] not in row.secret_sha256


def test_a_token_of_another_role_is_refused(client, root, pool, wellknown):
    minted = mint(root, pool)
    JoinToken.objects.filter(pk=minted["id"]).update(role="gateway")
    _, status, body = join(client, minted["token"], wellknown)
    assert (status, body["error"]["code"]) == (403, "join_refused")
    assert "role" in AuditEvent.objects.filter(allowed=False).latest("seq").reason


def test_a_replayed_sealed_token_is_refused(client, root, pool, wellknown):
    minted = mint(root, pool, maxUses=5)
    request, status, _ = join(client, minted["token"], wellknown)
    assert status == 200
    _, status, body = join(client, minted["token"], wellknown, request=request)
    assert (status, body["error"]["code"]) == (403, "join_refused")
    assert "replay" in AuditEvent.objects.filter(allowed=False).latest("seq").reason


@pytest.mark.django_db(transaction=True)
def test_concurrent_joins_on_a_single_use_token_have_one_winner(root, pool, wellknown):
    import threading

    from django.db import connection
    from django.test import Client

    minted = mint(root, pool)
    statuses, barrier = [], threading.Barrier(6)

    def machine(n):
        try:
            hardware = {**HARDWARE, "serial": f"SN-{n}", "productUuid": f"uuid-{n}"}
            request = prepare(minted["token"], wellknown, f"gpu-{n}")
            barrier.wait()
            statuses.append(join(Client(), minted["token"], wellknown, hardware=hardware,
                                 request=request)[1])
        finally:
            connection.close()

    threads = [threading.Thread(target=machine, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200, 403, 403, 403, 403, 403]
    assert JoinToken.objects.get(pk=minted["id"]).uses == 1
    assert Node.objects.count() == 1


def test_renewal_is_for_the_same_key_only_and_each_answer_is_audited(client, root, pool,
                                                                     wellknown, pins):
    from cryptography.hazmat.primitives.asymmetric import ec

    from bcd.join.documents import csr_for

    minted = mint(root, pool)
    request, _, body = join(client, minted["token"], wellknown)
    node_id = verify_answer(body["result"], request, pins, wellknown["trustDomain"])["nodeId"]

    def renew(key):
        csr = base64.b64encode(csr_for(key, node_id)).decode()
        response = client.post("/api/agent/renew", content_type="application/json",
                               data=json.dumps({"nodeId": node_id, "csr": csr}))
        return response.status_code, response.json()

    with assert_wrote(audit="node.renew"):
        status, answer = renew(request.key)
    assert status == 200
    assert answer["result"]["certificatePem"].startswith("-----BEGIN CERTIFICATE-----")
    with assert_wrote(audit=None):  # another key: refused, and nothing about the node moves
        status, answer = renew(ec.generate_private_key(ec.SECP256R1()))
    assert (status, answer["error"]["code"]) == (403, "renew_refused")
