"""The control plane with a fleet of simulated machines, at several sizes, in one run.

    python -m bench.fleet --nodes 100,1000 [--gateways 1] [--processes 2]

For each size N: a throw-away Postgres, the API, G gateways and a queue worker (as `dev`
runs them), then N simulated machines, each its own agent (node key, certificate, mTLS
session, journal, simulated GPUs), many to a process (`bcd sim agents`, spread over
`--processes` processes). It measures, from outside:

- join: from starting the machines until every one has joined (certificate on disk), and
  until every one is adopted with a live session;
- bookings through HTTP (8 clients, a new connection per request): per second, p50/p99;
- reserve -> active as a client sees it (create, then `get` every 20 ms), p50/p99;
- a spec push: a pool-wide policy change (a profile unit) until every node reported the
  generation it brought;
- an inventory storm: the gateway killed, every node reconnecting at once as it comes back,
  until every node has a new session and no report waits to be applied;
- Postgres connections, CPU seconds per component from adoption to the end (the bookings,
  the push and the storm), and the gateways' memory per session.

Each simulated machine reads its inventory every `--inventory-seconds` (10) instead of an
agent's 2: on real machines each pays that with its own cores, here a thousand share two
with the control plane. Telemetry, heartbeats and everything sent keep their defaults.

`storm_s` is two figures: until every node is connected again / until nothing waits to be
applied either.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bcd.config import Paths, joined_config
from bench.common import exit_on_term, table
from bench.stack import (
    bookings,
    by_kind,
    cpu_seconds,
    data_dir_of,
    memory_mib,
    p,
    reserve_to_active,
    stack_processes,
)
from compute.cli.dev import (
    ControlPlane,
    Stack,
    free_port,
    start_control_plane,
    start_machines,
    start_throwaway,
)

HOST = "127.0.0.1"
SETTLE_TIMEOUT = 1800.0
PUSHED_UNIT = "container-toolkit"  # a simulated machine reports it `unavailable`, at once


def wait(what: str, done: Callable[[], bool], stack: Stack, timeout: float = SETTLE_TIMEOUT,
         every: float = 0.25) -> float:
    """Seconds until `done()`, restarting what died meanwhile (as `dev` does)."""
    began = time.monotonic()
    while not done():
        stack.watch()
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic() - began


class Ledger:
    """What the bench reads straight from the stack's database."""

    def __init__(self, url: str, pool: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.pool = pool

    def one(self, sql: str, *args: Any) -> Any:
        row = self.conn.execute(sql, [self.pool, *args]).fetchone()
        return row[0] if row else None

    def live(self, since: dict[str, int] | None = None) -> int:
        """Nodes adopted with a connected session (newer than `since`'s epochs)."""
        rows = self.conn.execute(
            "SELECT id, session_epoch FROM fleet_node WHERE pool_id = %s AND role = 'node' "
            "AND provision_state = 'adopted' AND connectivity = 'connected'",
            [self.pool]).fetchall()
        return sum(1 for node_id, epoch in rows if epoch > (since or {}).get(node_id, 0))

    def epochs(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT id, session_epoch FROM fleet_node WHERE "
                                      "pool_id = %s", [self.pool]).fetchall())

    def generations(self) -> dict[str, int]:
        """Each node's newest spec generation."""
        return dict(self.conn.execute(
            "SELECT n.id, max(s.generation) FROM fleet_node n JOIN fleet_nodespec s ON "
            "s.node_id = n.id WHERE n.pool_id = %s AND n.role = 'node' GROUP BY n.id",
            [self.pool]).fetchall())

    def reported_above(self, generations: dict[str, int], unit: str) -> int:
        """Nodes that reported the state of profile unit `unit` for a generation above
        `generations`' own (a profile reported before its units converged names none)."""
        rows = self.conn.execute(
            "SELECT id, coalesce((profile->>'generation')::int, 0) FROM fleet_node WHERE "
            "pool_id = %s AND profile->'units' ? %s", [self.pool, unit]).fetchall()
        return sum(1 for node_id, generation in rows
                   if node_id in generations and generation > generations[node_id])

    def keeping(self, unit: str) -> int:
        """Nodes that reported the state of profile unit `unit`."""
        return int(self.one("SELECT count(*) FROM fleet_node WHERE pool_id = %s AND "
                            "profile->'units' ? %s", unit))

    def inbox(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM fleet_reportinbox").fetchone()[0])

    def connections(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE "
                                     "backend_type = 'client backend'").fetchone()[0])


def machines(stack: Stack, plane: ControlPlane, state: Path, count: int,
             processes: int) -> list[Path]:
    """Start `count` machines over `processes` processes; their roots."""
    roots = [state / "sim" / f"node-{n:05d}" for n in range(1, count + 1)]
    for part in range(processes):
        shard = roots[part::processes]
        if shard:
            start_machines(stack, plane.api, shard, shard, variant="gpu",
                           pool_id=plane.ids["poolId"], server=plane.url, env=plane.env,
                           places={}, name=f"sim-agents-{part + 1}")
    return roots


@dataclass
class Fleet:
    """A control plane and its simulated machines, all joined, adopted and connected."""

    stack: Stack
    server: Any
    plane: ControlPlane
    ledger: Ledger
    roots: list[Path]
    joined_s: float  # from starting the machines until every one joined
    adopted_s: float  # ... until every one is adopted with a live session
    gateways_mib: float  # the gateways' memory before the machines came

    def exports(self) -> dict[str, str]:
        """What bench.stack's clients take: the API, a token, the pool, the database."""
        return {"BETTER_COMPUTE_URL": self.plane.url,
                "BETTER_COMPUTE_TOKEN": self.plane.api.config.token,
                "POOL": self.plane.ids["poolId"], "DATABASE_URL": self.plane.env["DATABASE_URL"]}


@contextmanager
def fleet(count: int, folder: Path, *, gateways: int = 1, processes: int = 2,
          env_extra: dict[str, str] | None = None,
          timeout: float = SETTLE_TIMEOUT) -> Iterator[Fleet]:
    """A throw-away database, the API, `gateways` gateways and a queue worker (as `dev`
    runs them), and `count` simulated machines over `processes` processes; stopped after."""
    server, seeded = start_throwaway()
    stack = Stack(restart_delay=1.0, log_dir=folder / "logs")
    try:
        plane = start_control_plane(stack, server, host=HOST, port=free_port(),
                                    state_dir=folder, seeded=seeded, one_worker=True,
                                    gateways=gateways, env_extra=env_extra)
        ledger = Ledger(plane.env["DATABASE_URL"], plane.ids["poolId"])
        before = gateway_rss()
        roots = machines(stack, plane, folder, count, processes)
        joined = wait("join", lambda: all(joined_config(Paths(r)) for r in roots), stack,
                      timeout, every=1)
        adopted = joined + wait("adoption", lambda: ledger.live() >= count, stack, timeout,
                                every=1)
        yield Fleet(stack, server, plane, ledger, roots, joined, adopted, before)
    finally:
        stack.stop()
        server.stop()


def run_size(count: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    began = time.monotonic()
    with fleet(count, folder / f"fleet-{count}", gateways=args.gateways,
               processes=args.processes,
               env_extra={"BCD_INVENTORY_CHECK_SECONDS": str(args.inventory_seconds)}
               ) as machines_up:
        stack, ledger = machines_up.stack, machines_up.ledger
        print(f"{count} nodes: joined in {machines_up.joined_s:.1f} s, adopted and connected "
              f"in {machines_up.adopted_s:.1f} s", flush=True)
        processes = stack_processes(os.getpid(), data_dir_of(machines_up.server.url))
        cpu_before = by_kind(processes, cpu_seconds)
        session_kib = (gateway_rss() - machines_up.gateways_mib) * 1024 / count
        exports = machines_up.exports()
        active = reserve_to_active(exports, args.reservations, 4)
        booked = bookings(exports, args.clients, args.seconds, False, processes)
        push = spec_push(machines_up.plane, ledger, stack, count)
        storm, storm_connected = inventory_storm(ledger, stack, count)
        connections = ledger.connections()
        cpu = {kind: used - cpu_before[kind]
               for kind, used in by_kind(processes, cpu_seconds).items()}
        return {"nodes": count, "gateways": args.gateways,
                "join_s": f"{machines_up.joined_s:.1f}",
                "adopted_s": f"{machines_up.adopted_s:.1f}",
                "book_per_s": f"{booked['rate']:.1f}",
                "book_p50/p99_ms": f"{booked['p50'] * 1000:.0f}/{booked['p99'] * 1000:.0f}",
                "active_p50/p99_ms": f"{p(active, 50) * 1000:.0f}/{p(active, 99) * 1000:.0f}",
                "push_s": f"{push:.1f}",
                "storm_s": f"{storm_connected:.1f}/{storm:.1f}",
                "pg_conns": connections,
                "gw_kib_per_session": f"{session_kib:.0f}",
                "cpu_s": " ".join(f"{k}={v:.0f}" for k, v in cpu.items() if v >= 0.5),
                "took_s": f"{time.monotonic() - began:.0f}"}


def gateway_rss() -> float:
    """The gateways' resident memory (this process's descendants), in MiB."""
    return sum(memory_mib(pid, "Rss") for pid, kind in stack_processes(os.getpid(), "").items()
               if kind == "gateway")


def spec_push(plane: ControlPlane, ledger: Ledger, stack: Stack, count: int,
              timeout: float = SETTLE_TIMEOUT) -> float:
    """A pool-wide change (a profile unit for every node), until every node reported the
    generation that carries it."""
    before = ledger.generations()
    began = time.monotonic()
    plane.api.call("pools.update", {"poolId": plane.ids["poolId"],
                                    "policy": {"profile": {"units": [PUSHED_UNIT]}}})
    return time.monotonic() - began + wait(
        "spec push", lambda: ledger.reported_above(before, PUSHED_UNIT) >= count, stack,
        timeout)


def inventory_storm(ledger: Ledger, stack: Stack, count: int,
                    timeout: float = SETTLE_TIMEOUT) -> tuple[float, float]:
    """The gateway killed; seconds until every node has a new session, and until no report
    waits to be applied as well."""
    epochs = ledger.epochs()
    began = time.monotonic()
    stack.kill("gateway")
    connected = wait("reconnect", lambda: ledger.live(since=epochs) >= count, stack, timeout)
    wait("quiet", lambda: ledger.inbox() == 0, stack, timeout)
    return time.monotonic() - began, connected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="100,1000",
                        help="Fleet sizes, comma-separated [default: 100,1000].")
    parser.add_argument("--gateways", type=int, default=1)
    parser.add_argument("--processes", type=int, default=2,
                        help="Processes the simulated machines are spread over [default: 2].")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--reservations", type=int, default=40)
    parser.add_argument("--inventory-seconds", type=float, default=10.0,
                        help="How often each simulated machine reads its inventory.")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, exit_on_term)  # the stacks are stopped on TERM too
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for count in (int(n) for n in args.nodes.split(",")):
            rows.append(run_size(count, args, Path(folder)))
            print(rows[-1], flush=True)
    print()
    print(table(rows))
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        ratio = (float(last["active_p50/p99_ms"].split("/")[1])
                 / float(first["active_p50/p99_ms"].split("/")[1]))
        print(f"\nreserve -> active p99 at {last['nodes']} nodes: {ratio:.2f}x the figure at "
              f"{first['nodes']}")


if __name__ == "__main__":
    main()
