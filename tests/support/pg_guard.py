"""Stop the test session's throw-away Postgres when the session's process ends, however it
ends (SIGTERM, SIGKILL, a crash): the guard reads its stdin, a pipe only the session holds,
until end of file, then stops the server and deletes its folder. After a normal end the
session has done both already and the guard finds nothing to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from compute.core import pg


def guard(server: pg.EmbeddedPostgres) -> subprocess.Popen[bytes]:
    """Start the guard of `server` (the caller keeps the returned process's stdin open)."""
    return subprocess.Popen([sys.executable, "-m", "tests.support.pg_guard",
                             str(server.data_dir)], stdin=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[2], start_new_session=True)


def main() -> None:
    server = pg.EmbeddedPostgres(Path(sys.argv[1]), throwaway=True)
    sys.stdin.buffer.read()  # returns at end of file: the session's process is gone
    server.stop()


if __name__ == "__main__":
    main()
