"""Shared set-up for benchmarks: a database (embedded unless DATABASE_URL), Django, a world."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from compute.core import pg


def database() -> tuple[str, pg.EmbeddedPostgres | None]:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url, None
    server = pg.throwaway().start()
    os.environ["DATABASE_URL"] = server.url
    return server.url, server


def django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "compute.project.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of one process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def bench_environment() -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A migrated database (embedded unless DATABASE_URL) and a list for server processes;
    on the way out every process is stopped, then the throw-away database."""
    signal.signal(signal.SIGTERM, exit_on_term)  # so the `finally` below runs on TERM
    url, server = database()
    children: list[subprocess.Popen[bytes]] = []
    try:
        django_setup()
        yield url, children
    finally:
        for child in children:
            child.terminate()
            child.wait(15)
        if server is not None:
            server.stop()


def timed_threads(clients: int, seconds: float, work: Callable[[int], bool]) -> float:
    """Run `work(client)` in `clients` threads for `seconds`; successes per second."""
    import threading

    from django.db import connections

    done = [0] * clients
    deadline = time.monotonic() + seconds

    def loop(index: int) -> None:
        try:
            while time.monotonic() < deadline:
                if work(index):
                    done[index] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def start_api(port: int, workers: int | None = None) -> subprocess.Popen[bytes]:
    """The API as `better-compute serve` runs it, on loopback."""
    from compute.cli.serve import default_workers, server_argv

    process = subprocess.Popen(
        server_argv("127.0.0.1", port, workers=workers or default_workers()),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "BETTER_COMPUTE_LOG_LEVEL": "WARNING"})
    import socket

    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the API did not start")


def table(rows: list[dict[str, Any]]) -> str:
    """The figures, followed by the machine's load as they were taken (the same run takes
    several times longer on a busy machine: a figure is quoted with its load)."""
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(str(r[c]).ljust(w) for c, w in zip(columns, widths, strict=True))
              for r in rows]
    return "\n".join([*lines, machine_load()])


def machine_load() -> str:
    one, five, fifteen = os.getloadavg()
    return (f"machine: {os.cpu_count() or 1} cores, load average {one:.1f} / {five:.1f} / "
            f"{fifteen:.1f} (1, 5, 15 min)")
