"""`dev --memory` starts from a stopped copy of a migrated cluster instead of migrating."""

from __future__ import annotations

import psycopg

from compute.core import pg


def test_a_saved_copy_starts_as_a_new_server_holding_what_the_first_held(tmp_path):
    first = pg.throwaway().start()
    second = None
    try:
        with psycopg.connect(first.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (42)")
        copy = tmp_path / "copy"
        first.save_copy(copy)
        assert (copy / "PG_VERSION").exists()
        assert not (copy / "postmaster.pid").exists()  # a stopped cluster
        assert first.is_running()  # started again after the copy
        second = pg.throwaway().start(seed=copy)
        assert second.data_dir != first.data_dir
        with psycopg.connect(second.url) as conn:
            assert conn.execute("SELECT n FROM kept").fetchone() == (42,)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_the_copy_is_named_after_the_migrations_and_package_versions():
    name = pg.migrated_copy()
    assert name == pg.migrated_copy()
    assert name.parent == pg.state_root() / "migrated"
    assert len(name.name) == 16


def test_a_parent_made_private_while_the_server_runs_does_not_stop_it_being_saved(tmp_path):
    """pytest makes its temporary root private again (0700) when another session starts
    under it; the server's own user must still reach its folder to stop and copy it."""
    private = tmp_path / "home"
    server = pg.EmbeddedPostgres(private / "pg", throwaway=True).start()
    try:
        private.chmod(0o700)
        server.save_copy(tmp_path / "copy")
        assert (tmp_path / "copy" / "PG_VERSION").exists()
        assert server.is_running()
    finally:
        server.stop()
