"""Create (or update) the gateway's Postgres role with only the grants it needs.

    python manage.py bc_gateway_role [--role bc_gateway] [--password-file F]

Run it after `migrate` (and after each upgrade), as the database's owner. The gateway then
connects as this role (its own DATABASE_URL): it can keep sessions and file reports, and
cannot change a reservation (see fleet.gateway_role).
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, transaction
from psycopg import sql

from fleet.gateway_role import (
    DEFAULT_ROLE,
    grant_statements,
    inserted_tables,
    scram_verifier,
)


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--role", default=DEFAULT_ROLE)
        parser.add_argument("--password-file", type=Path, default=None,
                            help="The role's password (first line); without it the role "
                                 "can log in only where pg_hba trusts it.")

    @transaction.atomic
    def handle(self, *args: object, role: str, password_file: Path | None,
               **options: object) -> None:
        password = password_file.read_text().splitlines()[0] if password_file else None
        name = sql.Identifier(role)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            verb = "ALTER" if cursor.fetchone() else "CREATE"
            cursor.execute(sql.SQL("{} ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                                   "NOINHERIT").format(sql.SQL(verb), name).as_string(
                                       cursor.connection))
            if password is not None:  # its SCRAM verifier: the password never leaves here
                cursor.execute(sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(
                    name, sql.Literal(scram_verifier(password))).as_string(
                        cursor.connection))
            sequences = []
            for table in inserted_tables():  # the sequences (serial or identity) they own
                cursor.execute("SELECT s.oid::regclass::text FROM pg_class s JOIN pg_depend d "
                               "ON d.objid = s.oid WHERE s.relkind = 'S' "
                               "AND d.refobjid = %s::regclass", [table])
                sequences += [row[0] for row in cursor.fetchall()]
            cursor.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(connection.settings_dict["NAME"]), name).as_string(
                    cursor.connection))
            for statement in grant_statements(role, sequences):
                cursor.execute(statement.as_string(cursor.connection))
        self.stdout.write(f"role {role}: {len(sequences)} sequences and the gateway's grants")
