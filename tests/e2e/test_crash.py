"""kill -9 the agent mid-command: restarted, it runs nothing twice and converges."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import psycopg
import pytest

from compute.cli.dev import DEV_API_WORKERS
from tests.e2e.conftest import start_stack, stop_stack
from tests.support.waiting import wait_until

FAST = {"BETTER_COMPUTE_HEARTBEAT_SECONDS": "1", "BETTER_COMPUTE_NODE_LEASE_SECONDS": "5",
        # Every certificate counts as near expiry, checked every 2 s: renewal in action.
        "BCD_RENEW_MARGIN_HOURS": "25", "BCD_RENEW_CHECK_SECONDS": "2",
        # A restarted agent that cannot reach the gateway at once tries again within 5 s,
        # not 30: the waits below measure the journal's answer, not the backoff.
        "BCD_BACKOFF_MAX_SECONDS": "5"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = start_stack(tmp_path_factory.mktemp("crash"), "--sim", "1", "--sim-processes",
                          env_extra=FAST)
    yield running
    stop_stack(running)


def agent_root(stack):
    return next((stack.state_dir / "sim").iterdir())


def agent_pid(root) -> int | None:
    listing = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True,
                             check=True).stdout
    for line in listing.splitlines():
        # `bcd node`, or `bcd join --run` (dev's machines join and run in one process)
        if "-m bcd" in line and (f"--root {root} node" in line or
                                 (f"--root {root} join" in line and "--run" in line)):
            return int(line.split()[0])
    return None


QUEUE = """
import json, sys
import django
django.setup()
from django.db import transaction
from fleet.services.specs import command_create, desired_state_changed
with transaction.atomic():
    command = command_create(node_id=sys.argv[1], kind="sim.mark",
                             payload=json.loads(sys.argv[2]))
    desired_state_changed()
print(command.id)
"""


def queue_command(stack, node_id, payload) -> str:
    """A `sim.mark` command queued as the control plane queues one: signed for the node."""
    queued = subprocess.run(
        [sys.executable, "-c", QUEUE, node_id, json.dumps(payload)], check=True,
        capture_output=True, text=True, timeout=60,
        env={**stack.env, "DJANGO_SETTINGS_MODULE": "compute.project.settings"})
    return queued.stdout.strip().splitlines()[-1]


def command_state(stack, command_id) -> str:
    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        return conn.execute("SELECT state FROM fleet_nodecommand WHERE id = %s",
                            [command_id]).fetchone()[0]


def answered(stack, command_id) -> bool:
    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        state, finished = conn.execute("SELECT state, finished_at FROM fleet_nodecommand "
                                       "WHERE id = %s", [command_id]).fetchone()
    return state == "succeeded" and finished is not None


def journal_has(root, command_id, phase) -> bool:
    path = root / "var/lib/bcd/journal.jsonl"
    return path.exists() and any(
        json.loads(line).get("key") == command_id and json.loads(line).get("phase") == phase
        for line in path.read_text().splitlines() if line.strip())


def marks(root) -> list[str]:
    path = root / "var/lib/bcd/marks"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize(("case", "payload", "expected_marks"), [
    ("after acting, before reporting", {"pauseAfter": 4}, 1),
    ("between journaling and acting", {"pauseBefore": 4}, 0),
])
def test_kill_9_mid_command_runs_nothing_twice(stack, case, payload, expected_marks):
    root = agent_root(stack)
    node_id = stack.ok("nodes", "list", "--query", "items.0.id")
    before = len(marks(root))
    mark = f"m{int(time.time() * 1000)}"
    command_id = queue_command(stack, node_id, {**payload, "mark": mark})
    if "after" in case:
        assert wait_until(lambda: mark in marks(root)), "the command never acted"
    else:
        assert wait_until(lambda: journal_has(root, command_id, "begin"))
    pid = agent_pid(root)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: agent_pid(root) not in (None, pid), 60), "dev did not restart it"
    # The restarted agent answers only after deciding (from its journal) not to run it
    # again, so once the answer is in, a second run would already show in the marks.
    # (Seconds alone; on cores busy with the suite's other stacks, more than 30.)
    assert wait_until(lambda: command_state(stack, command_id) == "unknown", 120)
    assert len(marks(root)) - before == expected_marks
    assert marks(root).count(mark) == expected_marks
    assert not journal_has(root, command_id, "done")
    assert stack.ok("nodes", "get", node_id, "--query", "connectivity") == "connected"


def test_a_command_delivered_twice_after_a_restart_runs_once(stack):
    root = agent_root(stack)
    node_id = stack.ok("nodes", "list", "--query", "items.0.id")
    mark = f"once{int(time.time() * 1000)}"
    command_id = queue_command(stack, node_id, {"mark": mark})
    assert wait_until(lambda: command_state(stack, command_id) == "succeeded")
    with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("UPDATE fleet_nodecommand SET state = 'sent', finished_at = NULL "
                     "WHERE id = %s", [command_id])
    pid = agent_pid(root)
    os.kill(pid, signal.SIGKILL)  # reconnects: the 'sent' command is delivered again
    assert wait_until(lambda: agent_pid(root) not in (None, pid), 60), "dev did not restart it"
    # The new agent answers the redelivered command (from its journal): only then count.
    assert wait_until(lambda: answered(stack, command_id), 120), "never delivered again"
    assert marks(root).count(mark) == 1


def test_the_agent_renews_its_certificate_over_the_session_before_expiry(stack):
    from cryptography import x509

    root = agent_root(stack)
    cert_file = root / "etc/bcd/node-cert.pem"
    first = x509.load_pem_x509_certificate(cert_file.read_bytes())
    assert wait_until(lambda: x509.load_pem_x509_certificate(
        cert_file.read_bytes()).serial_number != first.serial_number, 20)
    renewed = x509.load_pem_x509_certificate(cert_file.read_bytes())
    assert renewed.public_key() == first.public_key()
    assert oct(cert_file.stat().st_mode & 0o777) == "0o600"
    node_id = stack.ok("nodes", "list", "--query", "items.0.id")
    assert stack.ok("nodes", "get", node_id, "--query", "connectivity") == "connected"


def pids_of(stack, needle: str) -> set[int]:
    """The live processes under this stack's dev whose command line holds `needle`."""
    found = set()
    for child in psutil.Process(stack.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone, or a zombie not yet reaped
            if child.status() != psutil.STATUS_ZOMBIE and needle in " ".join(child.cmdline()):
                found.add(child.pid)
    return found


def test_a_killed_api_and_worker_are_restarted_and_the_stack_keeps_working(stack):
    api = pids_of(stack, "compute.project.asgi:application")  # gunicorn's master and its workers
    worker = sorted(pids_of(stack, "bc_worker --loop"))[0]
    assert len(api) == 1 + DEV_API_WORKERS
    for pid in api:
        os.kill(pid, signal.SIGKILL)
    os.kill(worker, signal.SIGKILL)
    assert wait_until(lambda: len(pids_of(stack, "compute.project.asgi:application") - api)
                      == 1 + DEV_API_WORKERS, 30)
    assert wait_until(lambda: worker not in pids_of(stack, "bc_worker --loop") and
                      len(pids_of(stack, "bc_worker --loop")) >= 1, 30)
    assert stack.process.poll() is None  # dev itself is still up
    assert wait_until(lambda: stack.cli("api", "system.whoami").returncode == 0, 30)
    reserved = stack.cli("reserve", "--pool", stack.env["POOL"], "--gpus", "1", "--for", "5m",
                         "--query", "state")
    assert reserved.stdout.strip() == "active", reserved.stderr
