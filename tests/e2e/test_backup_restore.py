"""A backup restored to a point in time, as docs/operations/backups.md does it: a base
backup (`pg_basebackup`) and the archived WAL replayed up to a named restore point.

The control plane and its machines then run on the restored ledger. A reservation booked
after the restore point is unknown to it while its node still holds it: the node learns
that the ledger is behind what it applied, drops the hold (its release is recorded with
why), and the GPUs are booked again without an overlap. Every tenant's audit log verifies
and the ledger's invariants hold."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bcd.contract.holds import holds_under
from compute.cli.sim.observe import ledger_checks
from compute.core import pg
from tests.e2e.conftest import Stack, free_port, start_stack, stop_stack
from tests.support.waiting import wait_until

RESTORE_POINT = "before-the-last-booking"


@pytest.mark.campaign
@pytest.mark.timeout(900)  # two stacks, a backup and a restore: slow on a loaded machine
def test_a_point_in_time_restore_converges_the_fleet_to_the_restored_ledger(tmp_path):
    archive = tmp_path / "wal-archive"
    server = archiving_server(tmp_path / "pg", archive)
    backup = tmp_path / "base-backup"
    env = {"DATABASE_URL": server.url, "BETTER_COMPUTE_HOME": str(tmp_path / "home")}
    port = free_port()  # the address the machines joined through stays across the restore
    try:
        stack = start_stack(tmp_path, "--sim", "2", env_extra=env, memory=False, port=port)
        try:
            before_backup = book_active(stack)
            base_backup(server, backup)
            after_backup = book_active(stack)  # in the archived WAL only
            sql(server, "SELECT pg_create_restore_point(%s)", RESTORE_POINT)
            lost = book_active(stack)  # after the restore point: lost by the restore
            lost_node = lost["binding"]["nodeId"]
            sql(server, "SELECT pg_switch_wal()")
            wait_until(lambda: archived_everything(server), 30)
        finally:
            assert stop_stack(stack) == 0
        roots = sorted((tmp_path / "state" / "sim").iterdir())
        assert any(h.reservation_id == lost["id"] for r in roots for h in holds_under(r).values())

        restore(server, backup, archive)
        stack = start_stack(tmp_path, "--sim", "2", env_extra=env, memory=False, port=port)
        try:
            assert state_of(stack, before_backup["id"]) == "active"
            assert state_of(stack, after_backup["id"]) == "active"  # replayed from the WAL
            assert state_of(stack, lost["id"]) == "not_found"

            def dropped() -> bool:
                return not any(h.reservation_id == lost["id"]
                               for r in roots for h in holds_under(r).values())

            assert wait_until(dropped, 60), "the node still holds what the ledger lost"
            [rebased] = stack.json("events", "list", "--types", "node.spec.rebased",
                                   "--subject", lost_node)["items"]
            said = rebased["payload"]
            assert said["generation"] > said["journalGeneration"] > said["ledgerGeneration"]
            released = stack.json("audit", "list", "--action", "allocation.release")["items"]
            assert [r for r in released if r["actorId"] == lost_node
                    and "no such allocation" in r["reason"]], released

            again = [book_active(stack) for _ in range(2)]  # every GPU is booked once more
            assert {a["binding"]["nodeId"] for a in again} >= {lost_node}
            checks = wait_for_invariants(stack, roots)
            assert not any(checks[name] for name in ("I1", "I3", "I5")), checks
            for tenant in stack.json("tenants", "list")["items"]:
                verified = stack.json("audit", "verify", "--tenant", tenant["slug"])
                assert verified["ok"], verified
                assert verified["checkedEvents"] > 0
        finally:
            assert stop_stack(stack) == 0
    finally:
        server.stop()


def archiving_server(data_dir: Path, archive: Path) -> pg.EmbeddedPostgres:
    """A server that copies each finished WAL segment to `archive` (continuous archiving)."""
    server = pg.EmbeddedPostgres(data_dir).start()
    archive.mkdir()
    owned_by_server(archive)
    sql(server, "ALTER SYSTEM SET archive_mode = 'on'")
    sql(server, f"ALTER SYSTEM SET archive_command = 'test ! -f {archive}/%f && cp %p "
        f"{archive}/%f'")
    server.halt()  # archive_mode takes a restart
    return server.start()


def base_backup(server: pg.EmbeddedPostgres, into: Path) -> None:
    into.mkdir()
    owned_by_server(into)
    as_server([pg._bin("pg_basebackup"), "-D", str(into), "-X", "stream", "--checkpoint",
               "fast", "-d", server.admin_url()])


def restore(server: pg.EmbeddedPostgres, backup: Path, archive: Path) -> None:
    """Stop the server, put the base backup in its place and replay the archive up to the
    restore point, then open for writes (a new timeline)."""
    server.halt()
    shutil.move(server.data_dir, server.data_dir.with_name("pg-lost"))
    shutil.copytree(backup, server.data_dir, symlinks=True)
    for lock in server.data_dir.glob(".s.PGSQL.*.lock"):  # the embedded server's socket
        lock.unlink()  # lives in its data folder: its lock file is in the backup
    with (server.data_dir / "postgresql.auto.conf").open("a") as conf:
        conf.write(f"restore_command = 'cp {archive}/%f %p'\n"
                   f"recovery_target_name = '{RESTORE_POINT}'\n"
                   "recovery_target_action = 'promote'\n")
    (server.data_dir / "recovery.signal").touch()
    owned_by_server(server.data_dir, recursive=True)
    server.start()
    assert wait_until(lambda: not sql(server, "SELECT pg_is_in_recovery()")[0][0], 60)


def archived_everything(server: pg.EmbeddedPostgres) -> bool:
    [(last, current)] = sql(server, "SELECT last_archived_wal, pg_walfile_name("
                            "pg_current_wal_lsn()) FROM pg_stat_archiver")
    return last is not None and last < current


def sql(server: pg.EmbeddedPostgres, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(server.admin_url(), autocommit=True) as db:
        cursor = db.execute(query, params or None)
        return cursor.fetchall() if cursor.description else []


def as_server(argv: list[str]) -> None:
    done = subprocess.run(argv, user=pg.SERVER_USER if os.geteuid() == 0 else None,
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr


def owned_by_server(path: Path, recursive: bool = False) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chown", *(["-R"] if recursive else []),
                        f"{pg.SERVER_USER}:", str(path)], check=True)
        pg._open_path_to(path)


def book_active(stack: Stack) -> dict[str, Any]:
    made = stack.json("reserve", "--pool", stack.env["POOL"], "--gpus", "4", "--for", "1h")
    assert wait_until(lambda: state_of(stack, made["id"]) == "active", 90), made
    found: dict[str, Any] = stack.json("reservations", "get", made["id"])
    return found


def state_of(stack: Stack, reservation_id: str) -> str:
    answer = stack.cli("reservations", "get", reservation_id, "--output", "json")
    if answer.returncode != 0:
        return "not_found" if "not_found" in answer.stderr else answer.stderr
    return str(json.loads(answer.stdout)["state"])


def wait_for_invariants(stack: Stack, roots: list[Path]) -> dict[str, Any]:
    """The ledger's invariants once the machines converged (I3 empty), or the last look."""
    env = {**stack.env, "DJANGO_SETTINGS_MODULE": "compute.project.settings"}
    found: dict[str, Any] = {}

    def converged() -> bool:
        nonlocal found
        from bcd.config import Paths, joined_config

        joined = [c.node_id for r in roots if (c := joined_config(Paths(r))) is not None]
        found = ledger_checks(env, roots, joined, settle=10.0) or {"I3": ["unread"]}
        return not found["I3"]

    wait_until(converged, 60, interval=2)
    return found
