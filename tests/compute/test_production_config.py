"""Running against a real Postgres: DATABASE_URL as libpq reads it (several hosts, sockets,
TLS and session parameters, also on the LISTEN connection), the secrets every host must
share required when the database is on the network, and no embedded server started behind
an operator's back."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from compute.core.db import conninfo
from compute.core.dburl import networked, parse_database_url


def test_several_hosts_and_every_libpq_parameter_reach_both_connections():
    url = ("postgresql://app:p%40ss@db-a:5432,[fd00::2]:5433,db-c/ledger?sslmode=verify-full"
           "&sslrootcert=/etc/better-compute/ca.pem&target_session_attrs=read-write"
           "&connect_timeout=5")
    db = parse_database_url(url)
    assert (db["HOST"], db["PORT"], db["USER"], db["PASSWORD"], db["NAME"]) == (
        "db-a,fd00::2,db-c", "5432,5433,", "app", "p@ss", "ledger")
    assert db["OPTIONS"] == {"sslmode": "verify-full", "target_session_attrs": "read-write",
                             "sslrootcert": "/etc/better-compute/ca.pem", "connect_timeout": "5"}
    assert networked(db)
    assert conninfo_to_dict(conninfo(db)) == {
        "dbname": "ledger", "user": "app", "password": "p@ss", "host": "db-a,fd00::2,db-c",
        "port": "5432,5433,", "sslmode": "verify-full", "target_session_attrs": "read-write",
        "sslrootcert": "/etc/better-compute/ca.pem", "connect_timeout": "5"}
    assert not networked(parse_database_url("postgresql://u@/db?host=/run/postgresql"))
    with pytest.raises(ValueError, match="port 'x'"):
        parse_database_url("postgresql://u@db-a:x/db")


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="needs the embedded server")
def test_a_host_that_is_down_is_skipped_for_the_next_writable_one(embedded_postgres, tmp_path):
    url = (f"postgresql://postgres:{embedded_postgres.password()}@/better_compute?host="
           f"{tmp_path}/gone,{embedded_postgres.data_dir}&target_session_attrs=read-write")
    with psycopg.connect(conninfo(parse_database_url(url))) as connection:
        [(read_only,)] = connection.execute("SHOW transaction_read_only").fetchall()
    assert read_only == "off"


SETTINGS_SHOWN = ["-c", "import django; django.setup(); from django.db import connection\n"
                  "with connection.cursor() as c:\n"
                  "    for name in ('plan_cache_mode', 'statement_timeout'):\n"
                  "        c.execute(f'SHOW {name}'); print(c.fetchone()[0])"]


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="needs the embedded server")
def test_prepared_statements_are_planned_once_and_the_urls_own_options_stay(embedded_postgres):
    url = embedded_postgres.url + "&options=-c%20statement_timeout%3D7s"
    prepared = run(SETTINGS_SHOWN, DJANGO_SETTINGS_MODULE="compute.project.settings",
                   DATABASE_URL=url)
    assert prepared.stdout.split() == ["force_generic_plan", "7s"], prepared.stderr[-2000:]
    # Without prepared statements (a pooler that cannot follow them) the option is not sent.
    unprepared = run(SETTINGS_SHOWN, DJANGO_SETTINGS_MODULE="compute.project.settings",
                     DATABASE_URL=url, BETTER_COMPUTE_DB_PREPARE="0")
    assert unprepared.stdout.split() == ["auto", "7s"], unprepared.stderr[-2000:]


def run(code: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("BETTER_COMPUTE", "DATABASE_URL"))}
    return subprocess.run([sys.executable, *code], env={**clean, **env}, capture_output=True,
                          text=True, timeout=120, check=False)


SETUP = ["-c", "import django; django.setup(); print('configured')"]
REMOTE = {"DJANGO_SETTINGS_MODULE": "compute.project.settings",
          "DATABASE_URL": "postgresql://app@db.example.com:5432/ledger"}


def test_a_database_on_the_network_requires_the_shared_secrets(tmp_path):
    (tmp_path / "kek").write_text("")  # only its name is read at start-up
    missing_key = run(SETUP, **REMOTE)
    assert "BETTER_COMPUTE_SECRET_KEY (or BETTER_COMPUTE_SECRET_KEY_FILE) is required" in \
        missing_key.stderr
    missing_kek = run(SETUP, **REMOTE, BETTER_COMPUTE_SECRET_KEY="s" * 50)
    assert "BETTER_COMPUTE_KEK (or BETTER_COMPUTE_KEK_FILE) is required" in missing_kek.stderr
    (tmp_path / "secret").write_text("s" * 50 + "\n")
    both = run(SETUP, **REMOTE, BETTER_COMPUTE_SECRET_KEY_FILE=str(tmp_path / "secret"),
               BETTER_COMPUTE_KEK_FILE=str(tmp_path / "kek"))
    assert both.stdout.strip() == "configured", both.stderr
    local = run(SETUP, DJANGO_SETTINGS_MODULE="compute.project.settings",
                BETTER_COMPUTE_HOME=str(tmp_path / "home"),
                DATABASE_URL="postgresql://postgres@/db?host=/run/postgresql")
    assert local.stdout.strip() == "configured", local.stderr  # one host: made locally


def test_the_gateway_starts_no_embedded_server_behind_the_operators_back(tmp_path):
    home = tmp_path / "home"
    refused = run(["-m", "gateway", "--cert-dir", str(tmp_path)],
                  BETTER_COMPUTE_HOME=str(home))
    assert refused.returncode != 0
    assert "DATABASE_URL is not set and no embedded server runs" in refused.stderr
    assert not (home / "pg").exists()


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="needs the embedded server")
def test_the_embedded_server_asks_every_role_for_its_password(embedded_postgres):
    """SCRAM on its socket too: no role gets in on the socket's say-so."""
    with psycopg.connect(embedded_postgres.url) as connection:
        [(method,)] = connection.execute(
            "SELECT DISTINCT auth_method FROM pg_hba_file_rules").fetchall()
    assert method == "scram-sha-256"
    for user in ("postgres", f"postgres:{'x' * 43}"):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(f"postgresql://{user}@/better_compute?host="
                            f"{embedded_postgres.data_dir}", connect_timeout=5)
