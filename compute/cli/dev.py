"""`better-compute dev`: the whole control plane on this machine, in one command.

It starts an embedded Postgres (throw-away with --memory), migrates, bootstraps the root
tenant and an admin token, a default site and pool, then serves the API with daphne. Every
server runs as a child process; Ctrl-C (or SIGTERM) stops them all.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from compute import pg
from compute.cli.client import CliError


def _django(args: list[str], env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-m", "django", *args], env=env,
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CliError(f"django-admin {args[0]} failed:\n{result.stderr.strip()[-3000:]}")
    return result.stdout


def _wait_for_port(host: str, port: int, process: subprocess.Popen[bytes],
                   timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise CliError(f"the API server exited early with status {process.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise CliError(f"the API server did not listen on {host}:{port} within {timeout:.0f}s")


def _write_env_file(path: Path, lines: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.writelines(f"export {k}='{v}'\n" for k, v in lines.items())


@click.command("dev")
@click.option("--memory", is_flag=True, help="Use a throw-away database, deleted on exit.")
@click.option("--port", type=int, default=3000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--sim", "sim", type=click.IntRange(0, 256), default=0,
              help="Simulated machines to add (see the README).")
@click.option("--sim-variant", type=click.Choice(["gpu", "cpu"]), default="gpu",
              show_default=True, help="cpu gives machines without GPUs (and a CPU pool).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the admin token and env file go (default <state root>/dev).")
def dev(memory: bool, port: int, host: str, sim: int, sim_variant: str,
        state_dir: Path | None) -> None:
    """Run the control plane locally: Postgres, migrations, root token, API."""
    server = pg.throwaway() if memory else pg.persistent()
    click.echo(f"starting embedded Postgres in {server.data_dir} …", err=True)
    children: list[subprocess.Popen[bytes]] = []
    started_here = not server.is_running()
    try:
        server.start()
        env = {**os.environ, "DATABASE_URL": os.environ.get("DATABASE_URL") or server.url,
               "DJANGO_SETTINGS_MODULE": "compute.settings"}
        click.echo("migrating …", err=True)
        _django(["migrate", "--no-input"], env)
        state_dir = state_dir or pg.state_root() / "dev"
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        token_file = state_dir / "admin-token"
        setup_args = ["bc_dev_setup", "--token-file", str(token_file)]
        if sim_variant == "cpu":
            setup_args.append("--cpu-pool")
        ids: dict[str, Any] = json.loads(_django(setup_args, env).strip().splitlines()[-1])
        if sim:
            added = _django(["bc_dev_simulate", "--nodes", str(sim), "--variant", sim_variant,
                             "--pool", ids.get("cpuPoolId") or ids["poolId"]], env)
            click.echo(added.strip())
        api = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", host, "-p", str(port), "--access-log", "-",
             "compute.asgi:application"], env=env, stdout=subprocess.DEVNULL)
        children.append(api)
        _wait_for_port(host, port, api)
        url = f"http://{host}:{port}/api/compute"
        exports = {"BETTER_COMPUTE_URL": url, "BETTER_COMPUTE_TOKEN": token_file.read_text(),
                   "BETTER_COMPUTE_TENANT": "root", "POOL": ids["poolId"],
                   "SITE": ids["siteId"], "DATABASE_URL": env["DATABASE_URL"]}
        if "cpuPoolId" in ids:
            exports["CPU_POOL"] = ids["cpuPoolId"]
        env_file = state_dir / "env"
        _write_env_file(env_file, exports)
        click.echo(f"better-compute listening on {url}")
        click.echo(f"exports written to {env_file} (mode 0600); in another shell run:")
        click.echo(f"  . {env_file}")
        click.echo("Ctrl-C stops everything.")
        _wait_for_signal(children)
    finally:
        _stop(children)
        if started_here:
            server.stop()
        click.echo("stopped", err=True)


def _wait_for_signal(children: list[subprocess.Popen[bytes]]) -> None:
    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    while not stop["now"]:
        for child in children:
            if child.poll() is not None:
                raise CliError(f"a server process exited with status {child.returncode}")
        time.sleep(0.2)


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
