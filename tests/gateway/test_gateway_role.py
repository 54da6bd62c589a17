"""A gateway taken over cannot make the ledger say what no node signed: its Postgres role
(made by `bc_gateway_role`) may keep sessions and file reports, nothing more, and the worker
that applies filed reports checks each against the node's own key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from audit.sealing import KekUnavailable, kek
from bcd.contract.crypto import canonical, public_pem, sign_bytes
from bcd.contract.holds import Hold
from fleet.models import Node, NodeSpec, ReportInbox
from reservations.models import Reservation
from reservations.reports import reconcile_reports
from reservations.services.binding import reservation_bind
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.processes import database_url

pytestmark = pytest.mark.django_db(transaction=True)
ROLE = "bc_gateway_test"


@pytest.fixture
def as_gateway():
    """A connection as the gateway's role, made as `dev` and operators make it."""
    call_command("bc_gateway_role", "--role", ROLE, stdout=io.StringIO())
    url = urlsplit(database_url())
    netloc = f"{ROLE}@{url.netloc.rpartition('@')[2]}"
    with psycopg.connect(urlunsplit(url._replace(netloc=netloc)), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == ROLE
        yield conn


@pytest.mark.parametrize("statement", [
    "UPDATE reservations_reservation SET state = 'active'",
    "UPDATE reservations_booking SET during = tstzrange(now(), now() + interval '1 day')",
    "DELETE FROM reservations_allocation",
    "UPDATE fleet_node SET provision_state = 'adopted', cordoned = false",
    "UPDATE fleet_node SET public_key = ''",
    "UPDATE fleet_device SET health = 'healthy'",
    "INSERT INTO fleet_nodespec (node_id, generation, spec, signed, created_at) "
    "SELECT id, 99, '{}', '', now() FROM fleet_node",
    "UPDATE fleet_nodecommand SET payload = '{}'",
    "SELECT ciphertext FROM audit_sealedsecret",
    "UPDATE audit_auditevent SET reason = 'rewritten'",
    "SELECT payload FROM compute_event",
    "SELECT secret_sha256 FROM compute_apitoken",
])
def test_the_gateway_role_cannot(as_gateway, pool, statement):
    make_node(pool["id"])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_gateway.execute(statement)


def test_the_gateway_role_can_do_its_own_work(as_gateway, pool):
    node = make_node(pool["id"])
    assert as_gateway.execute("SELECT count(*) FROM fleet_nodespec WHERE node_id = %s",
                              [node.id]).fetchone()[0] == 1
    as_gateway.execute("UPDATE fleet_node SET last_heartbeat_at = now(), connectivity = "
                       "'connected' WHERE id = %s", [node.id])
    as_gateway.execute("INSERT INTO fleet_reportinbox (node_id, epoch, kind, fields, "
                       "received_at) VALUES (%s, 1, 'telemetry', '{}', now())", [node.id])
    assert ReportInbox.objects.filter(node=node).count() == 1


def test_the_roles_password_reaches_postgres_only_as_its_scram_verifier(tmp_path):
    password = "gw-" + "x7Q" * 6
    (tmp_path / "password").write_text(password + "\n")
    with CaptureQueriesContext(connection) as sent:
        call_command("bc_gateway_role", "--role", ROLE, "--password-file",
                     str(tmp_path / "password"), stdout=io.StringIO())
    assert sent.captured_queries
    assert not [q for q in sent.captured_queries if password in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [ROLE])
        stored = cursor.fetchone()[0]
    method, _, rest = stored.partition("$")
    iterations_salt, _, keys = rest.partition("$")
    iterations, salt = iterations_salt.split(":")
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt),
                                 int(iterations))
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    assert method == "SCRAM-SHA-256"
    assert keys.split(":")[0] == base64.b64encode(hashlib.sha256(client_key).digest()).decode()


def test_the_gateway_process_is_refused_the_kek(settings):
    settings.BC_WITHOUT_KEK = True
    with pytest.raises(KekUnavailable):
        kek()


def file_bound(conn, node_id, key, hold):
    """What a gateway does with an AllocationBound: file it in the node's inbox."""
    binding = Hold.from_wire(hold).binding()
    body = canonical({**binding, "generation": 2, "nodeId": node_id}).decode()
    fields = {"reportId": "r-" + sign_bytes(key, body.encode())[:12], "body": body,
              "signature": sign_bytes(key, body.encode())}
    conn.execute("INSERT INTO fleet_reportinbox (node_id, epoch, kind, fields, received_at) "
                 "VALUES (%s, 1, 'bound', %s, now())", [node_id, json.dumps(fields)])


def test_a_binding_the_gateway_forges_is_refused_and_the_nodes_own_is_taken(
        as_gateway, root, pool):
    node_key = ec.generate_private_key(ec.SECP256R1())
    node = make_node(pool["id"])
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(node_key.public_key()))
    rsv = reserve(root, pool, 4).result
    reservation_bind(reservation_id=rsv["id"])
    hold = NodeSpec.objects.filter(node=node).latest("generation").spec["allocations"][0]

    file_bound(as_gateway, node.id, ec.generate_private_key(ec.SECP256R1()), hold)  # forged
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # nor can it skip the check
        as_gateway.execute("UPDATE reservations_reservation SET state = 'active' "
                           "WHERE id = %s", [rsv["id"]])
    reconcile_reports(node.id)
    assert Reservation.objects.get(pk=rsv["id"]).state == "binding"
    refusal = AuditEvent.objects.get(action="reservation.activate", allowed=False)
    assert "not signed by" in refusal.reason
    assert not ReportInbox.objects.filter(node=node).exists()

    file_bound(as_gateway, node.id, node_key, hold)  # what the node itself signed
    reconcile_reports(node.id)
    assert Reservation.objects.get(pk=rsv["id"]).state == "active"
