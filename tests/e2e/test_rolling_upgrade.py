"""A rolling upgrade, as docs/operations/upgrades.md lays it out, with the fleet connected
and clients booking throughout.

The previous release runs (`dev` from its tree: API, gateway, workers, two machines' agents)
while four clients book and release. Then, as on a real host: this release's migrations run,
the gateway's grants are written again, the installed code is replaced (the folder every
process imports from now holds this release), and each process is restarted one at a time:
the API by SIGHUP (gunicorn replaces its workers, the listening socket stays), the queue
workers and the django-q2 cluster, the gateway, then each machine's agent. Between steps a
reservation binds on the machines, `/readyz` answers and `nodes list` shows the versions.
No booking call fails and every acknowledged reservation is in the ledger."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from bcd.contract.version import version
from compute.cli.client import Client, Config
from compute.client.transport import ApiError as LibraryApiError
from compute.client.transport import ClientError
from compute.core import pg
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.test_previous_release import REPOSITORY, previous_tree
from tests.support.waiting import wait_until


@pytest.mark.campaign
@pytest.mark.timeout(900)  # ~100 s alone; 300 s and more on a loaded 2-core machine
def test_a_rolling_upgrade_keeps_the_fleet_connected_and_loses_no_booking(tmp_path,
                                                                          monkeypatch):
    release = tmp_path / "release"  # the installed code: the previous release, then this one
    release.symlink_to(previous_tree(tmp_path / "previous"))
    elsewhere = tmp_path / "run"  # imports come from the installed code, never the folder
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    server = pg.throwaway().start()
    try:
        stack = start_stack(tmp_path, "--sim", "2", env_extra={
            "DATABASE_URL": server.url, "PYTHONPATH": str(release)})
        try:
            _roll(stack, release, server.url)
        finally:
            stop_stack(stack)
    finally:
        server.stop()


def _roll(stack: Stack, release: Path, database_url: str) -> None:
    bookers = Bookers(stack)
    bookers.start()
    steps = Steps()
    try:
        assert versions(stack) == {None}  # the previous release's gateway records none
        binds(stack)

        _manage(database_url, "migrate", "--no-input")
        _manage(database_url, "bc_gateway_role", "--password-file",
                str(stack.state_dir / "gateway-db-password"))
        binds(stack)  # the previous release, on the migrated schema
        bookers.expect_more()
        steps.done("migrate")

        new = release.with_name("release.new")  # the new code installed in place
        new.symlink_to(REPOSITORY)
        os.replace(new, release)

        api = only(stack, "gunicorn")
        os.kill(api, signal.SIGHUP)  # new workers with the new code; the socket stays
        assert wait_until(lambda: answers_as_this_release(stack), 60), "the API was not replaced"
        assert ready(stack)
        bookers.expect_more()
        steps.done("API")

        for name in ("bc_worker", "qcluster"):
            restart(stack, name)
        bookers.expect_more()
        steps.done("workers")

        restart(stack, "-m gateway")
        assert wait_until(lambda: versions(stack) == {"bcd-py"}, 60), versions(stack)
        binds(stack)  # agents of the previous release on this release's gateway
        steps.done("gateway")

        for agent in agents(stack):
            restart(stack, agent)
            assert wait_until(lambda: all_connected(stack), 60)
        assert wait_until(lambda: versions(stack) == {version()}, 60), versions(stack)
        binds(stack)
        bookers.expect_more()
        assert ready(stack)
        steps.done("agents")
    finally:
        bookers.stop()
    print(f"rolling upgrade: {len(bookers.acknowledged)} bookings acknowledged, "  # noqa: T201
          f"{len(bookers.failures)} failed, {len(bookers.lost())} lost; {steps}")
    assert bookers.failures == [], bookers.failures
    assert len(bookers.acknowledged) > 40
    assert bookers.lost() == {}


class Steps:
    """How long each step of the upgrade took."""

    def __init__(self) -> None:
        self.took: list[tuple[str, float]] = []
        self.since = time.monotonic()

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.took.append((name, now - self.since))
        self.since = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.took)


class Bookers:
    """Clients that book a GPU a day ahead and release it, over and over, counting every
    answer: what was acknowledged and what failed."""

    def __init__(self, stack: Stack) -> None:
        self.api = Client(Config(url=stack.env["BETTER_COMPUTE_URL"],
                                 token=stack.env["BETTER_COMPUTE_TOKEN"], tenant="root"),
                          timeout=30)
        self.pool = stack.env["POOL"]
        self.acknowledged: dict[str, str] = {}
        self.failures: list[str] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._book) for _ in range(4)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _book(self) -> None:
        """Each create carries an idempotency key, so a request cut by a server that
        restarts is sent again (as the client library does with `retry`) and books once."""
        calls = self.api.transport
        while not self.stopping.is_set():
            try:
                made = calls.call("reservations.create", {
                    "tenantId": "root", "poolId": self.pool, "startIn": 86_400_000,
                    "duration": 3_600_000, "devices": [{"class": "gpu", "count": 1}],
                    "idempotencyKey": str(uuid.uuid4())}, retry=True)
                self.acknowledged[made["id"]] = made["state"]
                done = calls.call("reservations.release", {
                    "tenantId": "root", "reservationId": made["id"]}, retry=True)
                self.acknowledged[made["id"]] = done["state"]
            except ClientError as error:
                self.failures.append(f"{time.strftime('%X')} {error}")
                time.sleep(0.2)

    def expect_more(self, count: int = 10) -> None:
        """Bookings go on: `count` more are acknowledged within a minute."""
        seen = len(self.acknowledged)
        assert wait_until(lambda: len(self.acknowledged) >= seen + count, 60), self.failures

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def lost(self) -> dict[str, tuple[str, str]]:
        """Acknowledged reservations whose state is not what was acknowledged. Each read is
        retried when its request is cut (a keep-alive connection to an API worker that the
        reload has since stopped), as the client library retries reads."""
        lost = {}
        calls = self.api.transport
        for rid, state in self.acknowledged.items():
            try:
                found = calls.call("reservations.get", {"tenantId": "root",
                                                        "reservationId": rid},
                                   retry=True)["state"]
            except LibraryApiError as error:
                found = error.code
            if found != state:
                lost[rid] = (state, found)
        return lost


def _manage(database_url: str, *argv: str) -> None:
    """A management command of this release (the operator's `python manage.py …`)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BETTER_COMPUTE", "DATABASE_URL", "PYTHONPATH"))}
    done = subprocess.run([sys.executable, "-m", "django", *argv], cwd=REPOSITORY,
                          env={**env, "DATABASE_URL": database_url,
                               "DJANGO_SETTINGS_MODULE": "compute.project.settings"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def children(stack: Stack) -> list[tuple[int, str]]:
    """(pid, command line) of every process `dev` started (its direct children)."""
    listing = subprocess.run(["ps", "-eww", "-o", "pid=,ppid=,args="], capture_output=True,
                             text=True, check=True).stdout
    found = []
    for line in listing.splitlines():
        pid, ppid, args = line.split(None, 2)
        if int(ppid) == stack.process.pid:
            found.append((int(pid), args))
    return found


def only(stack: Stack, marker: str) -> int:
    [pid] = [pid for pid, args in children(stack) if marker in args]
    return pid


def agents(stack: Stack) -> list[str]:
    """A marker for each simulated machine's agent (its root folder)."""
    roots = sorted((stack.state_dir / "sim").iterdir())
    return [f"--root {root} " for root in roots]


def restart(stack: Stack, marker: str) -> None:
    """Stop each process whose command line has `marker` as systemd's restart would
    (SIGTERM), one at a time, each once `dev` started the one before again."""
    running = [pid for pid, args in children(stack) if marker in args]
    assert running, marker
    for pid in running:
        os.kill(pid, signal.SIGTERM)

        def again(stopped: int = pid) -> bool:
            now = {p for p, args in children(stack) if marker in args}
            return stopped not in now and len(now) == len(running)

        assert wait_until(again, 60), f"{marker} was not started again"


def answers_as_this_release(stack: Stack) -> bool:
    """Every API worker runs this release: its node presenter names `agentVersion`."""
    return all("agentVersion" in machines(stack)[0] for _ in range(6))


def machines(stack: Stack) -> list[dict[str, Any]]:
    nodes = stack.json("nodes", "list", "--pool", stack.env["POOL"])["items"]
    return [n for n in nodes if n["role"] == "node"]


def versions(stack: Stack) -> set[str | None]:
    return {n.get("agentVersion") for n in machines(stack)}


def all_connected(stack: Stack) -> bool:
    return all(n["connectivity"] == "connected" for n in machines(stack))


def ready(stack: Stack) -> bool:
    base = stack.env["BETTER_COMPUTE_URL"].removesuffix("/api/compute")
    return httpx.get(f"{base}/readyz", timeout=10).status_code == 200


def binds(stack: Stack) -> None:
    """A reservation of GPUs now becomes active on a machine, and is released."""
    held = stack.json("reserve", "--pool", stack.env["POOL"], "--gpus", "4", "--for", "1h")

    def state() -> str:
        return str(stack.json("reservations", "get", held["id"])["state"])

    assert wait_until(lambda: state() == "active", 120), state()
    stack.json("release", held["id"])
