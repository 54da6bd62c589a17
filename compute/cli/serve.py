"""`better-compute serve`: the API in several worker processes, as production runs it.

gunicorn supervises the processes and each runs the ASGI application under uvicorn, so the
envelope, the console and the event streams are served on one port. HUP starts workers with
fresh code and lets the old ones finish what they are serving; TERM stops taking new
connections and waits for in-flight requests (at most `--graceful-timeout` seconds). `dev`
starts the API through the same `server_argv`.
"""

from __future__ import annotations

import os
import sys

import click

from compute.core import config

DEFAULT_PORT = 3000


def default_workers() -> int:
    """Two per CPU (a booking waits on Postgres about as long as it computes), at most 8."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def server_argv(host: str, port: int, *, workers: int, graceful_timeout: int = 30
                ) -> list[str]:
    """The command line that serves the API: gunicorn with uvicorn workers."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return [sys.executable, "-m", "gunicorn", "compute.project.asgi:application",
            "--worker-class", "compute.http.worker.ApiWorker", "--workers", str(workers),
            "--bind", address, "--graceful-timeout", str(graceful_timeout),
            # A worker tells its master it lives from its event loop, which a slow request
            # (run on a thread) does not block: this catches only a wedged worker.
            "--timeout", str(max(60, graceful_timeout * 2)),
            "--keep-alive", "75", "--log-level", "warning"]


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (put a TLS proxy in front for other hosts).")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option("--workers", type=click.IntRange(1, 128), default=None,
              help="Worker processes [default: two per CPU, at most 8].")
@click.option("--graceful-timeout", type=click.IntRange(1, 3600), default=30,
              show_default=True, help="Seconds in-flight requests get on stop or reload.")
def serve(host: str, port: int, workers: int | None, graceful_timeout: int) -> None:
    """Serve the API (envelope, console, event streams) with several worker processes."""
    from compute.core.pg import require_database_url

    config.export("DATABASE_URL", require_database_url())
    config.export_default("DJANGO_SETTINGS_MODULE", "compute.project.settings")
    count = workers or default_workers()
    click.echo(f"serving the API on http://{host}:{port} with {count} worker processes "
               "(HUP reloads, TERM drains)", err=True)
    argv = server_argv(host, port, workers=count, graceful_timeout=graceful_timeout)
    os.execv(sys.executable, argv)  # noqa: S606  (our own interpreter, fixed arguments)
