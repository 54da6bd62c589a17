"""A gateway taken over cannot make the ledger say what no node signed: its Postgres role
(made by `bc_gateway_role`) may keep sessions and file reports, nothing more, and the worker
that applies filed reports checks each against the node's own key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import os
import re
import secrets
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
from bcd.contract.reports import statement
from fleet.models import Node, NodeSpec, ReportInbox
from fleet.reports import reconcile_reports
from reservations.models import Reservation
from reservations.services.binding import reservation_bind
from tests.factories import make_node
from tests.reservations.conftest import reserve
from tests.support.processes import database_url

pytestmark = pytest.mark.django_db(transaction=True)
ROLE = "bc_gateway_test"


@pytest.fixture
def gateway_url(tmp_path):
    """The database URL of the gateway's role, made as `dev` and operators make it."""
    password = secrets.token_urlsafe(18)
    (tmp_path / "gateway-password").write_text(password)
    call_command("bc_gateway_role", "--role", ROLE, "--password-file",
                 str(tmp_path / "gateway-password"), stdout=io.StringIO())
    url = urlsplit(database_url())
    netloc = f"{ROLE}:{password}@{url.netloc.rpartition('@')[2]}"
    return urlunsplit(url._replace(netloc=netloc))


@pytest.fixture
def as_gateway(gateway_url):
    """A connection as the gateway's role."""
    with psycopg.connect(gateway_url, autocommit=True) as conn:
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
    "INSERT INTO audit_auditevent (tenant_id, actor_id, action) VALUES ('t', 'a', 'forged')",
    "INSERT INTO compute_event (tenant_id, type, subject) VALUES ('t', 'forged', 's')",
    "UPDATE audit_audithead SET size = 0",
    "SELECT cordoned FROM fleet_node",
    "SELECT result FROM fleet_nodecommand",
    "SELECT tenant_id FROM fleet_pool",
    "SELECT kind FROM fleet_nodereport",
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
    report_id = "r-" + secrets.token_hex(6)
    fields = {"reportId": report_id, "body": body, "signature": sign_bytes(key, body.encode()),
              "reportSignature": sign_bytes(key, statement(
                  kind="bound", report_id=report_id, epoch=1, body=body))}
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
    refusal = AuditEvent.objects.get(action="node.report", allowed=False)
    assert "not signed by" in refusal.reason
    assert not ReportInbox.objects.filter(node=node).exists()

    file_bound(as_gateway, node.id, node_key, hold)  # what the node itself signed
    reconcile_reports(node.id)
    assert Reservation.objects.get(pk=rsv["id"]).state == "active"


def held_privileges(conn, role: str) -> set[tuple[str, str, str]]:
    """What Postgres' catalogs say `role` holds on tables (column "" for a whole table)."""
    tables = conn.execute(
        "SELECT c.relname, a.privilege_type, '' FROM pg_class c, aclexplode(c.relacl) a "
        "WHERE a.grantee = %s::regrole AND c.relkind IN ('r', 'p', 'v', 'm')", [role])
    columns = conn.execute(
        "SELECT c.relname, a.privilege_type, att.attname FROM pg_attribute att "
        "JOIN pg_class c ON c.oid = att.attrelid, aclexplode(att.attacl) a "
        "WHERE a.grantee = %s::regrole", [role])
    return set(tables.fetchall()) | set(columns.fetchall())


def documented_grants() -> dict[str, str]:
    """The security page's table of the gateway's grants: table -> privileges."""
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "operations" / "security.md"
    section = page.read_text().split("The gateway's role holds exactly these grants", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|$", section.split("\n\n", 2)[1], re.M)
    return {table: privileges.strip() for table, privileges in rows}


def test_the_roles_grants_in_the_catalogs_are_the_declared_ones(as_gateway):
    from fleet.gateway_role import GRANTS, declared_privileges, inserted_tables

    assert held_privileges(as_gateway, ROLE) == declared_privileges()
    assert documented_grants() == GRANTS
    history = {"audit_", "compute_event", "reservations_", "fleet_device", "fleet_pool",
               "compute_apitoken", "fleet_nodereport"}
    assert not [table for table, _, _ in held_privileges(as_gateway, ROLE)
                if any(table.startswith(prefix) for prefix in history)]
    sequences = as_gateway.execute(
        "SELECT c.relname FROM pg_class c, aclexplode(c.relacl) a "
        "WHERE a.grantee = %s::regrole AND c.relkind = 'S'", [ROLE]).fetchall()
    assert {name for (name,) in sequences} <= {f"{table}_id_seq" for table in inserted_tables()}
    attributes = as_gateway.execute(
        "SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls OR rolreplication, "
        "(SELECT count(*) FROM pg_auth_members WHERE member = r.oid) "
        "FROM pg_roles r WHERE rolname = %s", [ROLE]).fetchone()
    assert attributes == (False, 0)


def signed_report(key, kind, node_id, epoch, body, **command):
    """A report as a node's agent sends it: its id, body and signature over its statement."""
    report_id = secrets.token_hex(8)
    fields = {"reportId": report_id, "body": body, "reportSignature": sign_bytes(
        key, statement(kind=kind, report_id=report_id, epoch=epoch, body=body,
                       **command))}
    if command:
        fields.update(commandId=command["command_id"], status=command["status"])
    return fields


def test_a_gateway_taken_over_changes_nothing_and_its_forgeries_are_refused_and_audited(
        gateway_url, root, pool):
    """The gateway process replaced by one that forges, with the gateway's database role:
    a binding, an inventory, telemetry and a command result no node signed, a session it
    never opened, an audit row, an event."""
    import subprocess
    import sys

    from audit.checkpoints import audit_verify
    from compute.platform.events.models import Event
    from fleet.models import Device, GpuSample, NodeCommand
    from tests.factories import inventory, open_session

    node_key, forger = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    node = make_node(pool["id"])
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(node_key.public_key()))
    epoch = open_session(node.id)
    rsv = reserve(root, pool, 4).result
    reservation_bind(reservation_id=rsv["id"])
    hold = NodeSpec.objects.filter(node=node).latest("generation").spec["allocations"][0]
    command = NodeCommand.objects.create(node=node, kind="diag.disk", state="sent")
    gpus = list(Device.objects.filter(node=node, device_class="gpu").values_list("uuid",
                                                                                flat=True))
    sick = inventory(hostname=node.hostname)
    for gpu in sick["gpus"]:
        gpu.update(health="unhealthy", healthReason="FORGED-BY-GATEWAY-ROLE")
    bound = canonical({**Hold.from_wire(hold).binding(), "generation": 2,
                       "nodeId": node.id}).decode()
    idle = json.dumps({"gpus": {uuid: {"utilization": 0} for uuid in gpus}})
    unsigned_inventory = {"reportId": "inv-forged", "body": json.dumps(sick)}
    altered = signed_report(node_key, "telemetry", node.id, epoch, json.dumps(
        {"gpus": {uuid: {"utilization": 100} for uuid in gpus}}))
    altered["body"] = idle  # the node's signature, over another body
    forgeries = [
        ("bound", {**signed_report(forger, "bound", node.id, epoch, bound),
                   "signature": sign_bytes(forger, bound.encode())}),
        ("inventory", unsigned_inventory),
        ("telemetry", signed_report(forger, "telemetry", node.id, epoch, idle)),
        ("telemetry", altered),
        ("command_result", {**signed_report(forger, "command_result", node.id, epoch,
                                            '{"ok": true}', command_id=command.id,
                                            status="succeeded"), "signature": "x"}),
    ]
    before = {"audit": AuditEvent.objects.filter(allowed=True).count(),
              "events": Event.objects.count(),
              "health": sorted(Device.objects.values_list("uuid", "health")),
              "reservation": Reservation.objects.get(pk=rsv["id"]).state}
    plan = {"nodeId": node.id, "epoch": epoch, "tenantId": rsv["tenantId"],
            "target": rsv["id"], "reports": forgeries}
    env = {**os.environ, "DATABASE_URL": gateway_url}
    answered = subprocess.run([sys.executable, "-m", "tests.support.forging_gateway"],
                              input=json.dumps(plan), capture_output=True, text=True,
                              env=env, timeout=60, check=True)
    answers = json.loads(answered.stdout.strip().splitlines()[-1])
    assert answers == {"user": ROLE, "audit": "InsufficientPrivilege",
                       "event": "InsufficientPrivilege",
                       "reservation": "InsufficientPrivilege"}

    reconcile_reports(node.id)  # the worker: verifies each report, applies none of them
    assert not ReportInbox.objects.filter(node=node).exists()
    assert Reservation.objects.get(pk=rsv["id"]).state == before["reservation"] == "binding"
    assert sorted(Device.objects.values_list("uuid", "health")) == before["health"]
    assert not GpuSample.objects.exists()
    assert NodeCommand.objects.get(pk=command.pk).state == "sent"
    assert AuditEvent.objects.filter(allowed=True).count() == before["audit"]
    assert Event.objects.count() == before["events"]
    refusals = list(AuditEvent.objects.filter(allowed=False, target=node.id)
                    .values_list("action", "reason"))
    assert sorted(action for action, _ in refusals) == ["node.report"] * 5 + ["node.session"]
    assert all("not signed by" in reason for action, reason in refusals
               if action == "node.report")
    assert audit_verify(tenant_id=rsv["tenantId"]).ok

    genuine = signed_report(node_key, "telemetry", node.id, epoch, idle)
    with psycopg.connect(gateway_url, autocommit=True) as conn:
        for _ in range(3):  # the node's own reading, replayed twice by the gateway
            conn.execute("INSERT INTO fleet_reportinbox (node_id, epoch, kind, fields, "
                         "received_at) VALUES (%s, %s, 'telemetry', %s, now())",
                         [node.id, epoch, json.dumps(genuine)])
    reconcile_reports(node.id)
    assert GpuSample.objects.count() == len(gpus)  # taken once
