"""The provable audit trail: positions in commit order, checkpoints, verify, prove."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection

from audit.checkpoints import audit_prove, audit_verify, checkpoint_seal
from audit.keys import public_key_b64
from audit.models import AuditEvent, Checkpoint
from audit.selectors import audit_event_list
from audit.sequencer import audit_sequence
from audit.services import audit_record, audited
from bcd.contract.auditproof import check_proof, event_leaf
from tests.support.writes import assert_wrote


@audited
def write(*, tenant, action, then=lambda: None):
    """One audited write that runs `then` before it commits."""
    event = audit_record(tenant_id=tenant, actor_id="t", action=action)
    then()
    return event


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@pytest.fixture
def log(root):
    """A root-tenant log of 25 events under two checkpoints (each seal's own row comes
    after the tree it signs), then 4 more events."""
    tenant_id = root("system.whoami")["tenantId"]
    for n in range(11):
        root("sites.create", kind="shared", region=f"r-{n}")
    first = checkpoint_seal(tenant_id=tenant_id)
    for n in range(12):
        root("sites.create", kind="dedicated", region=f"s-{n}")
    second = checkpoint_seal(tenant_id=tenant_id)
    for n in range(3):
        root("sites.create", kind="shared", region=f"t-{n}")
    assert (first.tree_size, second.tree_size) == (12, 25)  # + the bootstrap event
    return tenant_id


def test_an_untouched_log_verifies(log):
    report = audit_verify(tenant_id=log)
    assert report.ok, report.problem
    assert (report.checked, report.checkpoints) == (29, 2)


def test_edited_payload_is_named(log):
    sql("UPDATE audit_auditevent SET data = '{\"region\": \"elsewhere\"}' "
        "WHERE tenant_id = %s AND position = 7", [log])
    report = audit_verify(tenant_id=log)
    assert (report.ok, report.first_bad_position) == (False, 7)
    assert "does not match" in report.problem


def test_deleted_event_is_named(log):
    sql("DELETE FROM audit_auditevent WHERE tenant_id = %s AND position = 5", [log])
    report = audit_verify(tenant_id=log)
    assert (report.ok, report.first_bad_position) == (False, 5)


def test_deleted_event_with_renumbering_is_named(log):
    sql("DELETE FROM audit_auditevent WHERE tenant_id = %s AND position = 5", [log])
    sql("UPDATE audit_auditevent SET position = -(position - 1) WHERE tenant_id = %s "
        "AND position > 5", [log])
    sql("UPDATE audit_auditevent SET position = -position WHERE position < 0")
    report = audit_verify(tenant_id=log)
    assert (report.ok, report.first_bad_position) == (False, 5)
    assert "deleted" in report.problem


def test_two_reordered_events_are_named(log):
    sql("UPDATE audit_auditevent SET position = -4 WHERE tenant_id = %s AND position = 4", [log])
    sql("UPDATE audit_auditevent SET position = 4 WHERE tenant_id = %s AND position = 9", [log])
    sql("UPDATE audit_auditevent SET position = 9 WHERE tenant_id = %s AND position = -4", [log])
    report = audit_verify(tenant_id=log)
    assert (report.ok, report.first_bad_position) == (False, 4)


def test_inserted_event_is_named(log):
    sql("UPDATE audit_auditevent SET position = -(position + 1) WHERE tenant_id = %s "
        "AND position >= 6", [log])
    sql("UPDATE audit_auditevent SET position = -position WHERE position < 0")
    forged = AuditEvent(tenant_id=log, position=6, actor_id="prn_x", action="site.create",
                        target="site_x", data={})
    forged.leaf_hash = event_leaf(forged.wire()).hex()  # a well-formed row, hash and all
    forged.save(force_insert=True)
    report = audit_verify(tenant_id=log)
    assert (report.ok, report.first_bad_position) == (False, 6)
    assert "inserted" in report.problem


def test_a_rewritten_log_fails_against_the_signed_root(log):
    row = AuditEvent.objects.get(tenant_id=log, position=3)
    row.data = {"rewritten": True}
    row.leaf_hash = event_leaf(row.wire()).hex()  # the attacker recomputes the leaf too
    row.save(update_fields=["data", "leaf_hash"])
    report = audit_verify(tenant_id=log)
    assert report.ok is False
    assert report.first_bad_position == 1  # somewhere in the first checkpoint's range
    assert "signed root" in report.problem


def test_forged_checkpoint_signature_is_rejected(log):
    checkpoint = Checkpoint.objects.get(tenant_id=log, tree_size=25)
    import base64

    from audit.checkpoints import _statement

    other = Ed25519PrivateKey.generate()
    checkpoint.signature = base64.b64encode(other.sign(_statement(checkpoint))).decode()
    checkpoint.save(update_fields=["signature"])
    report = audit_verify(tenant_id=log)
    assert (report.ok, report.first_bad_position) == (False, 13)
    assert "signature" in report.problem


def test_a_broken_consistency_proof_is_rejected(log):
    checkpoint = Checkpoint.objects.get(tenant_id=log, tree_size=25)
    checkpoint.consistency = list(reversed(checkpoint.consistency))
    checkpoint.save(update_fields=["consistency"])
    report = audit_verify(tenant_id=log)
    assert report.ok is False
    assert "consistent" in report.problem


def test_checkpoint_continues_from_the_last_one(log):
    with assert_wrote(audit="audit.checkpoint"):
        third = checkpoint_seal(tenant_id=log)
    assert third.tree_size == 29
    assert third.previous.tree_size == 25
    with assert_wrote(audit=None):
        assert checkpoint_seal(tenant_id=log) is None  # only the seal's own row is new
    assert audit_verify(tenant_id=log).checkpoints == 3


def test_proof_verifies_offline_and_a_modified_event_does_not(log, tmp_path):
    event = AuditEvent.objects.get(tenant_id=log, position=10)
    document = audit_prove(tenant_id=log, event_id=event.id)
    key = public_key_b64()
    assert check_proof(document, key)[0] is True
    modified = json.loads(json.dumps(document))
    modified["event"]["data"]["region"] = "forged"
    assert check_proof(modified, key) == (
        False, "the event is not in the signed tree (hash path does not match)")
    other = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    import base64

    assert check_proof(document, base64.b64encode(other).decode())[0] is False
    # The CLI's verifier, offline, in a process with no database and no server.
    good, bad = tmp_path / "proof.json", tmp_path / "forged.json"
    good.write_text(json.dumps(document))
    bad.write_text(json.dumps(modified))
    run = [sys.executable, "-m", "compute.cli.main", "audit", "check-proof"]
    ok = subprocess.run([*run, str(good), "--public-key", key], capture_output=True, text=True,
                        env={"PATH": "/usr/bin:/bin"}, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "proof verifies" in ok.stdout
    refused = subprocess.run([*run, str(bad), "--public-key", key], capture_output=True,
                             text=True, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert refused.returncode == 1
    assert "does NOT verify" in refused.stderr


def test_prove_without_a_checkpoint_is_412(root):
    event = AuditEvent.objects.latest("seq")
    answer = root.call("audit.prove", eventId=event.id)
    assert (answer.status, answer.code) == (412, "failed_precondition")


def test_api_verify_and_prove(root, log):
    assert root("audit.verify")["ok"] is True
    event = AuditEvent.objects.get(tenant_id=log, position=2)
    proof = root("audit.prove", eventId=event.id)
    assert check_proof(proof, root.client.get("/.well-known/better-compute").json()[
        "auditSigningKey"]["publicKey"])[0]


@pytest.mark.django_db(transaction=True)
def test_positions_are_gapless_and_in_transaction_order_under_concurrency():
    tenant = "tnt_01jbx0000000000000000000zz"
    written: list[str] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        try:
            def slow_then(n: int = n) -> None:
                time.sleep(0.002 * (n % 5))
                if n % 7 == 0:
                    raise RuntimeError("roll back")

            event = write(tenant=tenant, action="test.write", then=slow_then)
            assert event.position is None  # given after commit, not under a lock
            with lock:
                written.append(event.id)
        except RuntimeError:
            pass
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(1, 41)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    committed = 40 - len([n for n in range(1, 41) if n % 7 == 0])
    assert audit_sequence(tenant_id=tenant) == committed
    assert audit_sequence(tenant_id=tenant) == 0  # final: nothing is numbered twice
    rows = list(AuditEvent.objects.filter(tenant_id=tenant).order_by("position"))
    assert [r.position for r in rows] == list(range(1, committed + 1))
    assert sorted(r.id for r in rows) == sorted(written)
    assert [r.txid for r in rows] == sorted(r.txid for r in rows)
    assert all(r.leaf_hash == event_leaf(r.wire()).hex() for r in rows)
    assert audit_verify(tenant_id=tenant).ok


@pytest.mark.django_db(transaction=True)
def test_a_writer_never_waits_for_an_uncommitted_one_and_is_numbered_after_it():
    tenant = "tnt_01jbx0000000000000000000zy"
    first_wrote, release_first = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        try:
            def hold_open() -> None:
                first_wrote.set()
                release_first.wait(5)
                order.append("first commits")

            write(tenant=tenant, action="test.first", then=hold_open)
        finally:
            connection.close()

    def second() -> None:
        try:
            first_wrote.wait(5)
            write(tenant=tenant, action="test.second")
            order.append("second commits")
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    threads[1].join(5)
    assert order == ["second commits"]  # no lock of the tenant's log held it back
    # The first transaction is still open: the second's row cannot be numbered yet, or a
    # later commit of the first would have to come before a position already given.
    assert audit_sequence(tenant_id=tenant) == 0
    assert audit_list_positions(tenant) == []
    release_first.set()
    threads[0].join(5)
    assert audit_sequence(tenant_id=tenant) == 2
    assert audit_list_positions(tenant) == [(1, "test.first"), (2, "test.second")]


def audit_list_positions(tenant: str) -> list[tuple[int, str]]:
    return [(r.position, r.action) for r in audit_event_list(tenant_id=tenant)]


def test_a_row_whose_position_was_wiped_is_named_by_verify(log):
    sql("UPDATE audit_auditevent SET position = NULL, leaf_hash = '' "
        "WHERE tenant_id = %s AND position = 5", [log])
    report = audit_verify(tenant_id=log)  # the row is numbered again, at the end
    assert not report.ok
    assert report.first_bad_position == 5


def test_audit_list_filters_and_names_the_ids_prove_takes(root, acme):
    site = root("sites.create", kind="shared", region="eu-7")
    refused = acme.call("sites.create", kind="shared", region="eu-8")  # only root may
    assert refused.code == "permission_denied"
    mine = root("audit.list", target=site["id"])["items"]
    assert [(r["action"], r["allowed"]) for r in mine] == [("site.create", True)]
    denials = acme("audit.list", allowed=False)["items"]
    assert [(r["action"], r["reason"] is not None) for r in denials] == [("sites.create", True)]
    assert acme("audit.list", action="sites.*", allowed=True)["items"] == []
    page = root("audit.list", limit=1)
    assert page["nextSince"] == page["items"][0]["position"]
    after = root("audit.list", since=page["nextSince"])["items"]
    assert after[0]["position"] == page["nextSince"] + 1
    checkpoint_seal(tenant_id=site["tenantId"])
    by_object = root("audit.prove", eventId=site["id"])  # the event it is about
    assert by_object["event"]["id"] == mine[0]["id"]
    assert check_proof(by_object, public_key_b64())[0]
    assert root.call("audit.prove", eventId="rsv_01jbx0000000000000000000aa").code == \
        "not_found"



def test_a_row_still_unsettled_when_the_seal_looks_is_left_to_the_next_seal(log):
    """A concurrent write's row that the numbering must skip (its transaction is newer than
    one still in flight) has no position when the seal looks for the last one. The seal
    covers what is numbered (before, the row's NULL sorted first as the end of the log:
    `no consistency proof from 25 to 0`, a 500), and the next seal takes the row."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")
        newer = cursor.fetchone()[0] + 1_000_000  # as a transaction not settled yet
    late = AuditEvent.objects.create(tenant_id=log, actor_id="t", action="late.write")
    AuditEvent.objects.filter(pk=late.pk).update(txid=newer)
    third = checkpoint_seal(tenant_id=log)
    assert third.tree_size == 29
    assert AuditEvent.objects.get(pk=late.pk).position is None
    AuditEvent.objects.filter(pk=late.pk).update(txid=None)  # its transaction settled
    fourth = checkpoint_seal(tenant_id=log)
    assert fourth.tree_size == 31  # the late row and the third seal's own row
    assert audit_verify(tenant_id=log).ok
