"""Two of everything against one database: `dev` plays the first host (API, gateway, workers,
restarted when they die, as systemd would) and this test starts a second API, gateway and
worker with nodes of their own. Mid-load, one API, one gateway and one worker are killed
with -9: no request is lost or answered twice, nothing is booked twice, and every
reservation goes active on its node."""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.support.processes import free_port
from tests.support.waiting import wait_until

RESERVATIONS = 16  # of 2 GPUs each: the 4 nodes' 32 GPUs, so every node holds some
KILL_AFTER = 6


@pytest.fixture
def hosts(tmp_path):
    home = {"BETTER_COMPUTE_HOME": str(tmp_path / "home")}
    first = start_stack(tmp_path, "--sim", "2", env_extra=home)
    second: list[subprocess.Popen[bytes]] = []
    try:
        yield first, start_second_host(first, tmp_path, second)
    finally:
        for process in second:
            process.terminate()
        for process in second:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        stop_stack(first)


def start_second_host(first: Stack, tmp: Path, processes: list) -> str:
    """API, gateway, worker and two simulated nodes of a second host; the API's URL."""
    api_port, gateway_port, join_port = free_port(), free_port(), free_port()
    env = {**first.env, "DJANGO_SETTINGS_MODULE": "compute.project.settings",
           "BETTER_COMPUTE_GATEWAY_URL": f"grpcs://127.0.0.1:{gateway_port}",
           "BETTER_COMPUTE_GATEWAY_JOIN_URL": f"grpcs://127.0.0.1:{join_port}",
           "BETTER_COMPUTE_LOG_LEVEL": "WARNING"}
    logs = tmp / "second"
    logs.mkdir()

    def start(name: str, *argv: str, extra: dict[str, str] | None = None) -> None:
        with (logs / f"{name}.log").open("wb") as log:
            processes.append(subprocess.Popen(argv, env={**env, **(extra or {})}, stdout=log,
                                              stderr=subprocess.STDOUT))

    subprocess.run([sys.executable, "-m", "django", "bc_gateway_credentials", "--out",
                    str(tmp / "gateway-2"), "--host", "127.0.0.1"], env=env, check=True,
                   capture_output=True)
    start("api", "better-compute", "serve", "--port", str(api_port), "--workers", "1")
    api = f"http://127.0.0.1:{api_port}"
    assert wait_until(lambda: _up(f"{api}/healthz"), timeout=60)
    start("gateway", sys.executable, "-m", "gateway", "--listen", f"127.0.0.1:{gateway_port}",
          "--join-listen", f"127.0.0.1:{join_port}", "--api-url", api,
          "--cert-dir", str(tmp / "gateway-2"))
    start("worker", sys.executable, "-m", "django", "bc_worker", "--loop")
    assert wait_until(lambda: _listening(join_port), timeout=60)
    token = first.json("join-tokens", "create", "--pool", first.env["POOL"], "--ttl", "1h",
                       "--max-uses", "2")["token"]
    pins = first.json("pki", "show")
    for n in (1, 2):
        root = tmp / f"second-node-{n}"
        joined = subprocess.run(
            [sys.executable, "-m", "bcd", "--root", str(root), "join", "--server",
             f"{api}/api/compute", "--serving-ca-pin", pins["servingCaSpkiPin"],
             "--join-signing-pin", pins["joinSigningKeyPin"],
             "--join-encryption-pin", pins["joinEncryptionKeyPin"], "--sim",
             "--hostname", f"second-{n}"], env={**env, "BCD_JOIN_TOKEN": token},
            capture_output=True, text=True, timeout=90, check=False)
        assert joined.returncode == 0, joined.stderr
        start(f"node-{n}", sys.executable, "-m", "bcd", "--root", str(root), "node")
    machines = {"gpu-01", "gpu-02", "second-1", "second-2"}  # and dev's provisioner
    assert wait_until(lambda: machines <= set(_connected(first)), timeout=90), \
        _connected(first)
    return f"{api}/api/compute"


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _connected(stack: Stack) -> list[str]:
    nodes = stack.json("nodes", "list", "--pool", stack.env["POOL"])["items"]
    return [n["hostname"] for n in nodes
            if n["provisionState"] == "adopted" and n["connectivity"] == "connected"]


def _reserve(apis: list[str], token: str, pool: str, key: str) -> dict:
    """Create one reservation with an idempotency key, through whichever API answers,
    retrying until one does (the answer to a retry is the first one's reservation)."""
    body = {"poolId": pool, "devices": [{"class": "gpu", "count": 2}], "duration": 3_600_000,
            "idempotencyKey": key}
    for api in itertools.islice(itertools.cycle(apis), 400):
        try:
            answer = httpx.post(f"{api}/reservations/create", json=body, timeout=10,
                                headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError:
            continue
        if answer.status_code < 500:
            payload = answer.json()
            assert payload["ok"], payload
            return payload["result"]
    raise AssertionError(f"no API answered {key}")


def _kill_one_of_each(stack: Stack) -> list[str]:
    """-9 to the first host's API (master and workers), gateway and one queue worker."""
    dev = psutil.Process(stack.process.pid)
    port = stack.env["BETTER_COMPUTE_URL"].split(":")[2].split("/")[0]
    lines = {child: " ".join(child.cmdline()) for child in dev.children(recursive=True)}
    worker = next(child for child, line in lines.items() if "bc_worker" in line)
    doomed = [child for child, line in lines.items()
              if (f":{port} " in line and "gunicorn" in line) or " -m gateway " in line]
    for child in [*doomed, worker]:
        child.send_signal(signal.SIGKILL)
    return [lines[child][:60] for child in [*doomed, worker]]


def test_two_apis_gateways_and_workers_survive_losing_one_of_each(hosts):
    first, second_api = hosts
    apis = [first.env["BETTER_COMPUTE_URL"], second_api]
    token, pool = first.env["BETTER_COMPUTE_TOKEN"].strip(), first.env["POOL"]
    answers: dict[str, dict] = {}
    lock = threading.Lock()
    killed: list[str] = []

    def client(keys: list[str]) -> None:
        for key in keys:
            result = _reserve(apis if int(key[1:]) % 2 else apis[::-1], token, pool, key)
            with lock:
                answers[key] = result
                if len(answers) == KILL_AFTER and not killed:
                    killed.extend(_kill_one_of_each(first))

    keys = [f"k{n}" for n in range(RESERVATIONS)]
    threads = [threading.Thread(target=client, args=(keys[n::4],)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert [any(part in line for line in killed) for part in ("gunicorn", "gateway",
                                                              "bc_worker")] == [True] * 3
    assert sorted(answers) == sorted(keys)
    ids = {answer["id"] for answer in answers.values()}
    assert len(ids) == RESERVATIONS  # no request answered with another's reservation

    def states() -> dict[str, str]:
        with psycopg.connect(first.env["DATABASE_URL"]) as db:
            return dict(db.execute("SELECT id, state FROM reservations_reservation"))

    def where() -> list[tuple]:
        with psycopg.connect(first.env["DATABASE_URL"]) as db:
            return db.execute(
                "SELECT r.id, r.state, n.hostname, n.connectivity, n.session_epoch "
                "FROM reservations_reservation r JOIN reservations_allocation a ON "
                "a.reservation_id = r.id JOIN fleet_node n ON n.id = a.node_id "
                "WHERE r.state <> 'active'").fetchall()

    assert wait_until(lambda: set(states()) == ids and set(states().values()) == {"active"},
                      timeout=180), where()
    with psycopg.connect(first.env["DATABASE_URL"]) as db:
        overlaps = db.execute(
            "SELECT count(*) FROM reservations_booking a JOIN reservations_booking b ON "
            "a.device_id = b.device_id AND a.id < b.id AND a.during && b.during").fetchone()
        holders = db.execute(
            "SELECT DISTINCT n.hostname FROM reservations_allocation a JOIN fleet_node n "
            "ON n.id = a.node_id WHERE a.ended_at IS NULL").fetchall()
    assert overlaps == (0,)
    assert {h for (h,) in holders} >= {"second-1", "second-2"}  # the second gateway's nodes
    assert len(holders) == 4
