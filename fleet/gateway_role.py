"""The gateway's own Postgres role: what it may touch, and nothing more.

The gateway keeps node sessions (epochs, heartbeats, connectivity), delivers the specs and
commands the control plane signed, and files reports in the inbox. It may not change a
reservation, a booking, a device or a node's provisioning, and writes no history (the audit
log, the event outbox): a gateway that is taken over can delay or drop messages, but cannot
make the ledger say something no node signed. GRANTS is the whole list; the security page
repeats it and a test compares it with what Postgres' catalogs say the role holds.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from psycopg import sql

from compute.platform.queue.models import WorkItem
from fleet.models import Node, NodeCommand, NodeSpec, ReportInbox

DEFAULT_ROLE = "bc_gateway"

# table -> privileges, on the columns named where named (an INSERT … RETURNING reads the
# returned key back; an upsert reads the columns it compares). Tables by their models.
GRANTS: dict[str, str] = {
    Node._meta.db_table: "SELECT (id, site_id, provision_state, session_epoch, connectivity, "
                  "last_heartbeat_at, connected_at, journal_epoch, agent_version, "
                  "agent_refused, gateway), "
                  "UPDATE (session_epoch, connectivity, last_heartbeat_at, connected_at, "
                  "journal_epoch, agent_version, agent_refused, gateway)",
    NodeCommand._meta.db_table: "SELECT (id, node_id, kind, signed, state, created_at, sent_at), "
                                "UPDATE (state, sent_at, finished_at)",
    NodeSpec._meta.db_table: "SELECT (id, node_id, generation, signed, txid)",
    ReportInbox._meta.db_table: "INSERT, SELECT (id)",
    WorkItem._meta.db_table: "INSERT, SELECT (kind, key, version, due_at), "
                             "UPDATE (version, due_at)",
}


def grant_statements(role: str, sequences: list[str]) -> list[sql.Composed]:
    """Revoke everything, then grant GRANTS, and USAGE of the id sequences (`sequences`) of
    the tables it inserts into."""
    name = sql.Identifier(role)
    statements = [sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {}").format(name),
                  sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {}").format(name),
                  sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(name)]
    for table, privileges in GRANTS.items():
        statements.append(sql.SQL("GRANT {} ON {} TO {}").format(
            sql.SQL(privileges), sql.Identifier(table), name))
    for sequence in sequences:
        statements.append(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
            sql.SQL(sequence), name))  # as pg_get_serial_sequence spells it, quoted
    return statements


def scram_verifier(password: str, *, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier Postgres stores for `password` (RFC 5802/7677), made
    here so that only the verifier, never the password, is sent to the server."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored_key = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    b64 = base64.b64encode
    return (f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}"
            f"${b64(stored_key).decode()}:{b64(server_key).decode()}")


def declared_privileges() -> set[tuple[str, str, str]]:
    """GRANTS as (table, privilege, column) triples; column "" for the whole table."""
    declared = set()
    for table, privileges in GRANTS.items():
        for privilege, columns in re.findall(r"(\w+)(?:\s*\(([^)]*)\))?", privileges):
            names = [name.strip() for name in columns.split(",")] if columns else [""]
            declared |= {(table, privilege, name) for name in names}
    return declared


def inserted_tables() -> list[str]:
    return [table for table, privileges in GRANTS.items() if "INSERT" in privileges]
