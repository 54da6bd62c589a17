"""Postgres failover under load, on Patroni: nothing acknowledged is lost, nothing overlaps.

    python -m bench.failover [--nodes 4] [--clients 4] [--before 20] [--after 30]

Starts one etcd and three Patroni members (Debian's `patroni`, PostgreSQL 15's binaries,
`synchronous_mode: true`, ttl 8 s, loop_wait 1 s, retry_timeout 3 s) on this machine, and
`better-compute dev --gateways 2 --sim N` on it through a libpq multi-host URL
(`target_session_attrs=read-write`): the API, two gateways, two queue workers and the
django-q2 cluster, and N simulated nodes, and a second API process (`better-compute serve`)
beside dev's. `--clients` clients, spread over the two APIs, book one GPU for ten minutes
and release it, over and over (each booking with an idempotency key, retried until it is
answered). After `--before` seconds the leader's postmaster is killed with -9, then its
Patroni; the load goes on for `--after` seconds. Printed: the write outage (first failed to
first successful booking after the kill), bookings acknowledged and present after the
failover, overlapping bookings, the nodes' sessions (all connected again, `node.unreachable`
events since the kill) and the bookings made after the failover that turned active (the
queue workers' leases were taken over). Then one gateway is killed with -9, and the time
until its nodes are connected through the other is printed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from bench.common import table
from compute.cli.dev import free_port, read_env_file

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PASSWORD = "bench-" + uuid.uuid4().hex[:12]
READY_LINE = "Ctrl-C stops everything"


def patroni_config(name: str, work: Path, etcd: int, port: int, rest: int) -> str:
    return json.dumps({  # JSON is YAML
        "scope": "bc-failover", "name": name,
        "restapi": {"listen": f"127.0.0.1:{rest}", "connect_address": f"127.0.0.1:{rest}"},
        "etcd3": {"hosts": f"127.0.0.1:{etcd}"},
        "bootstrap": {
            "dcs": {"ttl": 8, "loop_wait": 1, "retry_timeout": 3,
                    "maximum_lag_on_failover": 1048576, "synchronous_mode": True,
                    "postgresql": {"use_pg_rewind": True, "parameters": {
                        "max_connections": 300, "wal_log_hints": "on",
                        "max_wal_senders": 10, "max_replication_slots": 10}}},
            "initdb": [{"encoding": "UTF8"}, "data-checksums"],
            "pg_hba": ["local all all trust",
                       "host replication replicator 127.0.0.1/32 scram-sha-256",
                       "host all all 127.0.0.1/32 scram-sha-256"]},
        "postgresql": {
            "listen": f"127.0.0.1:{port}", "connect_address": f"127.0.0.1:{port}",
            "data_dir": str(work / name), "bin_dir": str(PG_BIN),
            "pgpass": str(work / f"{name}.pgpass"),
            "authentication": {
                "superuser": {"username": "postgres", "password": PASSWORD},
                "replication": {"username": "replicator", "password": PASSWORD}},
            "parameters": {"unix_socket_directories": str(work)}},
    })


@dataclass
class Member:
    name: str
    port: int
    rest: int
    process: subprocess.Popen[bytes]

    def role(self) -> str:
        try:
            return str(httpx.get(f"http://127.0.0.1:{self.rest}/patroni", timeout=1)
                       .json().get("role", ""))
        except (httpx.HTTPError, ValueError):
            return ""


def start_cluster(work: Path) -> tuple[list[subprocess.Popen[bytes]], list[Member]]:
    etcd_port = free_port()
    etcd = subprocess.Popen(
        ["etcd", "--data-dir", str(work / "etcd"), "--listen-client-urls",
         f"http://127.0.0.1:{etcd_port}", "--advertise-client-urls",
         f"http://127.0.0.1:{etcd_port}", "--listen-peer-urls", f"http://127.0.0.1:{free_port()}"],
        stdout=(work / "etcd.log").open("wb"), stderr=subprocess.STDOUT)
    members = []
    for number in (1, 2, 3):
        name, port, rest = f"pg{number}", free_port(), free_port()
        config = work / f"{name}.yml"
        config.write_text(patroni_config(name, work, etcd_port, port, rest))
        shutil.chown(config, "postgres")
        process = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", "patroni", str(config)],
            stdout=(work / f"{name}.log").open("wb"), stderr=subprocess.STDOUT)
        members.append(Member(name, port, rest, process))
        if number == 1:  # the first bootstraps the cluster; the others copy it
            wait(lambda: members[0].role() in ("master", "primary"), 90, "a leader")
    wait(lambda: sum(m.role() == "replica" for m in members) == 2, 120, "two replicas")
    return [etcd], members


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise SystemExit(f"bench.failover: no {what} after {timeout:.0f} s")


def database_url(members: list[Member], name: str = "bc") -> str:
    hosts = ",".join(f"127.0.0.1:{m.port}" for m in members)
    return (f"postgresql://postgres:{PASSWORD}@{hosts}/{name}"
            "?target_session_attrs=read-write&connect_timeout=3")


def control_plane_env(work: Path, url: str) -> dict[str, str]:
    """What every process of the control plane reads: the database and the shared secrets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE")}
    secrets_dir = work / "secrets"  # as an operator keeps them: files, shared by every host
    secrets_dir.mkdir(mode=0o700)
    for name, value in (("secret-key", secrets.token_urlsafe(48)),
                        ("kek", base64.b64encode(secrets.token_bytes(32)).decode())):
        (secrets_dir / name).write_text(value)
        (secrets_dir / name).chmod(0o600)
    env.update(DATABASE_URL=url, BETTER_COMPUTE_SECRET_KEY_FILE=str(secrets_dir / "secret-key"),
               BETTER_COMPUTE_KEK_FILE=str(secrets_dir / "kek"))
    return env


def start_dev(env: dict[str, str], work: Path, nodes: int
              ) -> tuple[subprocess.Popen[str], dict[str, str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "compute.cli.main", "dev", "--memory", "--port",
         str(free_port()), "--sim", str(nodes), "--gateways", "2", "--state-dir",
         str(work / "dev")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if line.startswith(READY_LINE):
            break
    else:
        raise SystemExit("dev exited:\n" + "".join(lines[-30:]))
    output = process.stdout
    threading.Thread(target=lambda: [None for _ in output], daemon=True).start()
    return process, read_env_file(work / "dev" / "env")


@dataclass
class Load:
    token: str
    pool: str
    acknowledged: dict[str, float] = field(default_factory=dict)  # id -> when answered
    failures: list[float] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, client: httpx.Client, method: str, body: dict[str, Any]) -> Any:
        """The method's result, retried (same body, same idempotency key) until answered."""
        while not self.stop.is_set():
            try:
                answer = client.post(f"/{method.replace('.', '/')}", json=body, timeout=10)
                if answer.status_code < 500 and answer.json().get("ok"):
                    with self.lock:
                        self.successes.append(time.monotonic())
                    return answer.json()["result"]
            except (httpx.HTTPError, ValueError):
                pass
            with self.lock:
                self.failures.append(time.monotonic())
            time.sleep(0.2)
        return None

    def client(self, api: str) -> None:
        with httpx.Client(base_url=api,
                          headers={"Authorization": f"Bearer {self.token}"}) as client:
            while not self.stop.is_set():
                booked = self.call(client, "reservations.create", {
                    "poolId": self.pool, "devices": [{"class": "gpu", "count": 1}],
                    "duration": 600_000, "idempotencyKey": uuid.uuid4().hex})
                if booked is None:
                    return
                with self.lock:
                    self.acknowledged[booked["id"]] = time.monotonic()
                self.call(client, "reservations.release", {"reservationId": booked["id"]})


@dataclass
class Watcher:
    """Follows `events/watch` (reservation events), resuming after the last sequence seen
    whenever the stream breaks."""

    url: str
    token: str
    seen: list[int] = field(default_factory=list)
    resumed: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def follow(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        while not self.stop.is_set():
            since = self.seen[-1] if self.seen else 0
            try:
                with httpx.stream("GET", f"{self.url}/events/watch", headers=headers,
                                  params={"types": "reservation.*", "since": since},
                                  timeout=httpx.Timeout(10, read=20)) as response:
                    if response.status_code == 200:
                        for line in response.iter_lines():
                            if line.strip():
                                self.seen.append(int(json.loads(line)["seq"]))
                            if self.stop.is_set():
                                return
            except (httpx.HTTPError, ValueError):
                pass
            self.resumed += 1
            time.sleep(0.5)


def kill_leader(members: list[Member]) -> Member:
    leader = next(m for m in members if m.role() in ("master", "primary"))
    postmaster = int((WORK / leader.name / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)
    time.sleep(0.5)
    for process in psutil.Process(leader.process.pid).children(recursive=True):
        if "patroni" in " ".join(process.cmdline()):
            process.send_signal(signal.SIGKILL)
    leader.process.send_signal(signal.SIGKILL)
    return leader


WORK = Path()


@dataclass
class Api:
    process: subprocess.Popen[bytes]
    url: str


def start_api(env: dict[str, str]) -> Api:
    """`better-compute serve` on a port of its own, on the same database and secrets."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "compute.cli.main", "serve", "--port", str(port),
         "--workers", "1", "--graceful-timeout", "5"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait(answers, 60, "the second API")
    return Api(process, f"{base}/api/compute")


def failover(*, nodes: int, clients: int, before: float, after: float) -> dict[str, Any]:
    """The whole run (cluster, control plane, load, kills); what `report` prints."""
    global WORK
    WORK = Path(tempfile.mkdtemp(prefix="bc-failover-"))
    shutil.chown(WORK, "postgres")
    processes: list[subprocess.Popen[Any]] = []
    members: list[Member] = []
    dev = None
    try:
        processes, members = start_cluster(WORK)
        with psycopg.connect(database_url(members, "postgres"), autocommit=True) as db:
            db.execute("CREATE DATABASE bc")
        url = database_url(members)
        plane = control_plane_env(WORK, url)
        dev, env = start_dev(plane, WORK, nodes)
        second = start_api(plane)  # a second API process, as on a second host
        processes.append(second.process)
        print(f"cluster up: {', '.join(f'{m.name}={m.role()}' for m in members)}; dev ready",
              flush=True)
        apis = [env["BETTER_COMPUTE_URL"], second.url]
        return run(clients, before, after, members, url, {**env, "apis": ",".join(apis)})
    finally:
        if dev is not None:
            dev.send_signal(signal.SIGINT)
            dev.wait(60)
        for member in members:
            member.process.send_signal(signal.SIGTERM)
        for member in members:
            member.process.wait(30)
        for process in processes:
            process.terminate()
            process.wait(10)
        shutil.rmtree(WORK, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--before", type=float, default=20)
    parser.add_argument("--after", type=float, default=30)
    args = parser.parse_args()
    report(failover(nodes=args.nodes, clients=args.clients, before=args.before,
                    after=args.after))


def run(clients: int, before: float, after: float, members: list[Member], url: str,
        env: dict[str, str]) -> dict[str, Any]:
    apis = env["apis"].split(",")
    load = Load(env["BETTER_COMPUTE_TOKEN"], env["POOL"])
    watcher = Watcher(apis[-1], load.token)
    threads = [threading.Thread(target=load.client, args=(apis[i % len(apis)],))
               for i in range(clients)]
    threading.Thread(target=watcher.follow, daemon=True).start()
    for thread in threads:
        thread.start()
    time.sleep(before)
    killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
    old = kill_leader(members)
    time.sleep(after)
    load.stop.set()
    for thread in threads:
        thread.join(30)
    first_failure = min((t for t in load.failures if t >= killed_at), default=None)
    back = min((t for t in load.successes if first_failure and t > first_failure),
               default=None)
    survivors = [m for m in members if m is not old]
    with psycopg.connect(database_url(survivors)) as db:
        present = {row[0] for row in db.execute(
            "SELECT id FROM reservations_reservation WHERE id = ANY(%s)",
            [list(load.acknowledged)])}
        overlaps = db.execute(
            "SELECT count(*) FROM reservations_booking a JOIN reservations_booking b ON "
            "a.device_id = b.device_id AND a.id < b.id AND a.during && b.during").fetchone()
        began = time.monotonic()
        wait(lambda: db.execute("SELECT count(*) FROM compute_workitem WHERE due_at < "
                                "now() - interval '10 seconds'").fetchone() == (0,), 120,
             "work queue caught up")
        caught_up = time.monotonic() - began
        wait(lambda: db.execute("SELECT count(*) FROM fleet_node WHERE role = 'node' AND "
                                "connectivity <> 'connected'").fetchone() == (0,), 60,
             "connected nodes")
        unreachable = db.execute(
            "SELECT count(*) FROM compute_event WHERE type = 'node.unreachable' AND "
            "created_at > %s", [killed_wall]).fetchone()[0]
        nodes = db.execute("SELECT count(*) FROM fleet_node WHERE role = 'node'").fetchone()[0]
        # (an event committed but not numbered yet is newer than every numbered one: the
        # watch numbers it when it reads; workers still write, such as ending notices)
        events = {row[0] for row in db.execute(
            "SELECT position FROM compute_event WHERE type LIKE 'reservation.%%' "
            "AND position IS NOT NULL")}
        deadline = time.monotonic() + 60  # a missed event is reported, not waited for
        while not set(watcher.seen) >= events and time.monotonic() < deadline:
            time.sleep(0.2)
        watcher.stop.set()
    moved = gateway_failover(url)
    return {"outage": (back - first_failure) if back and first_failure else 0.0,
            "acknowledged": len(load.acknowledged), "present": len(present),
            "overlaps": overlaps[0], "nodes": nodes, "unreachable": unreachable,
            "caughtUp": caught_up, "bookings": len(load.successes),
            "events": len(events), "missed": len(events - set(watcher.seen)),
            "repeated": len(watcher.seen) - len(set(watcher.seen)),
            "resumed": watcher.resumed,
            "failures": len(load.failures), "leader": f"{old.name} -> " + ", ".join(
                f"{m.name}={m.role()}" for m in survivors), **moved}


def gateway_failover(url: str) -> dict[str, Any]:
    """Kill the gateway holding most sessions; seconds until its nodes are connected
    through the other (dev restarts it, but not before they moved)."""
    with psycopg.connect(url, autocommit=True) as db:
        holders: dict[str, str] = dict(db.execute(
            "SELECT id, gateway FROM fleet_node WHERE role = 'node'"))
        victim = max(set(holders.values()), key=list(holders.values()).count)
        ours = [node for node, gateway in holders.items() if gateway == victim]
        epochs: dict[str, int] = dict(db.execute(
            "SELECT id, session_epoch FROM fleet_node WHERE id = ANY(%s)", [ours]))
        for process in psutil.process_iter(["cmdline"]):
            line = process.info["cmdline"] or []
            if "gateway" in line and line[-1] == victim and str(WORK) in " ".join(line):
                process.send_signal(signal.SIGKILL)
        killed = time.monotonic()

        def moved() -> bool:
            rows = db.execute("SELECT id, gateway, session_epoch, connectivity FROM "
                              "fleet_node WHERE id = ANY(%s)", [ours]).fetchall()
            return all(g != victim and e > epochs[n] and c == "connected"
                       for n, g, e, c in rows)

        wait(moved, 60, "nodes moved to the other gateway")
        return {"gatewayMoved": len(ours), "gatewaySeconds": time.monotonic() - killed}


def report(result: dict[str, Any]) -> None:
    print(table([{"measure": measure, "value": value} for measure, value in [
        ["leader killed (postmaster, then Patroni)", result["leader"]],
        ["write outage (first failed to first successful booking)",
         f"{result['outage']:.1f} s"],
        ["bookings and releases answered / failed attempts",
         f"{result['bookings']} / {result['failures']}"],
        ["reservations acknowledged / present after failover",
         f"{result['acknowledged']} / {result['present']}"],
        ["overlapping bookings", str(result["overlaps"])],
        ["nodes connected again / node.unreachable events since the kill",
         f"{result['nodes']} / {result['unreachable']}"],
        ["watch stream: reservation events / missed / repeated / resumptions",
         f"{result['events']} / {result['missed']} / {result['repeated']} / "
         f"{result['resumed']}"],
        ["work items overdue by 10 s after the failover: none after",
         f"{result['caughtUp']:.1f} s"],
        ["gateway killed: nodes connected through the other",
         f"{result['gatewayMoved']} in {result['gatewaySeconds']:.1f} s"],
    ]]))


if __name__ == "__main__":
    main()
