"""One simulator run: the real control plane (embedded Postgres, the API as `serve` runs it,
the gateway, the workers) and real bcd agents, each behind a fault-injecting proxy, driven
by a seed's workload and faults; then the invariants.

Heartbeats, the node lease and the binding timeout are divided by the time scale, so ten
simulated minutes take one real minute at `--time-scale 10`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from bcd.config import Paths, joined_config
from compute.cli.client import CliError
from compute.cli.dev import (
    DatabaseWatch,
    Stack,
    agent_environment,
    default_image,
    free_port,
    join_simulated,
    power_off_simulated_vms,
    start_control_plane,
    start_throwaway,
)
from compute.cli.sim.fenced import fencing_policy
from compute.cli.sim.observe import (
    FLEET_ORIGINS_EXCLUDE,
    commands_run_twice,
    iam_decisions,
    ledger_checks,
)
from compute.cli.sim.proxy import Network
from compute.cli.sim.schedule import Fault, Plan, plan
from compute.cli.sim.workload import Workload

HOST = "127.0.0.1"
CHECK_EVERY = 5.0  # real seconds between I1 checks while faults run
SETTLE = 10.0  # real seconds a binding or a release may be on its way (not a divergence)
DELIVERY_WAIT = 30.0  # real seconds a command may take to reach a machine cut off a while
EXCLUDE_CONSTRAINTS = ("reservations_booking_device_no_overlap",
                       "reservations_booking_gpu_no_overlap")


@dataclass
class Options:
    seed: int
    nodes: int = 4
    minutes: float = 10.0
    time_scale: float = 10.0
    without: frozenset[str] = frozenset()  # "exclude", "journal", "fence": the proofs
    only: tuple[str, ...] = ()  # fault kinds: only these, all run long
    state_dir: Path | None = None
    converge_within: float = 90.0  # real seconds after the last fault for I3 to hold
    places: tuple[str, ...] = ()  # BCD_TOPOLOGY of the first machines; later ones in turn


@dataclass
class Report:
    seed: int
    options: dict[str, Any]
    faults: list[dict[str, Any]] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    invariants: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(result["ok"] for result in self.invariants.values())


class Run:
    def __init__(self, options: Options, echo: Callable[[str], None]) -> None:
        self.options, self.echo = options, echo
        self.plan: Plan = plan(options.seed, options.nodes, options.minutes, options.only)
        self.scale = options.time_scale
        self.lock = threading.RLock()  # the stack's children are changed by fault threads
        self.roots: list[Path] = []
        self.agent_env: dict[str, dict[str, str]] = {}
        self.report = Report(seed=options.seed, options={
            "nodes": options.nodes, "minutes": options.minutes,
            "timeScale": options.time_scale, "without": sorted(options.without),
            "onlyFaults": list(options.only)})
        self.i1_problems: list[str] = []
        self.i7_problems: list[str] = []
        self.planned_restart = threading.Event()  # the database's own restart fault runs

    # --- the stack ---------------------------------------------------------------------

    def start(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.server, seeded = start_throwaway()
        self.database = DatabaseWatch(self.server, restart_delay=0.3, restart_max=30 / self.scale)
        self.stack = Stack(restart_delay=0.3, log_dir=state_dir / "logs",
                           restart_max=30 / self.scale)
        scaled = {"BETTER_COMPUTE_HEARTBEAT_SECONDS": str(max(1, round(10 / self.scale))),
                  "BETTER_COMPUTE_NODE_LEASE_SECONDS": str(max(3, round(40 / self.scale))),
                  "BETTER_COMPUTE_BINDING_TIMEOUT_SECONDS": str(max(10, round(300 / self.scale))),
                  "BCD_BACKOFF_MAX_SECONDS": str(30 / self.scale),
                  "BETTER_COMPUTE_DB_RETRY_MAX_SECONDS": str(30 / self.scale),
                  # Several requests at once in each API process, as on a server with
                  # more cores than this one: a rush's bookers then race for one node.
                  "BETTER_COMPUTE_API_THREADS": "4",
                  "BETTER_COMPUTE_IAM_BACKEND": "compute.platform.iam.logged.LoggedIAM",
                  "BETTER_COMPUTE_IAM_DECISION_LOG": str(state_dir / "iam-decisions.log"),
                  # Without the constraints, the services' own recheck goes too: the proof
                  # is that an overlap the ledger lets in is caught by I1.
                  **({"BETTER_COMPUTE_LEDGER_RECHECK": "0"}
                     if "exclude" in self.options.without else {})}
        self.plane = start_control_plane(self.stack, self.server, host=HOST, port=free_port(),
                                         state_dir=state_dir, env_extra=scaled, seeded=seeded)
        self.env = self.plane.env
        if "exclude" in self.options.without:
            with psycopg.connect(self.env["DATABASE_URL"], autocommit=True) as conn:
                for name in EXCLUDE_CONSTRAINTS:  # constant names; the table is the catalog's
                    row = conn.execute("SELECT conrelid::regclass::text FROM pg_constraint "
                                       "WHERE conname = %s", [name]).fetchone()
                    if row is None:
                        raise RuntimeError(f"no constraint {name} to drop")
                    conn.execute(f"ALTER TABLE {row[0]} DROP CONSTRAINT {name}")
        default_image(self.plane.api, [self.plane.ids["poolId"]], self.plane.downloads,
                       self.plane.url.removesuffix("/api/compute"))
        self.network = Network()
        if "fence" not in self.options.without:  # without: the pool only notifies
            fencing_policy(self.plane.api, self.plane.ids["poolId"])
        self.workload = Workload(self.plane.api, self.plane.ids["poolId"], self.scale, self.env)
        self.join(self.options.nodes)

    def join(self, count: int) -> None:
        """Join `count` more simulated machines, each behind a link of its own, and start
        them; wait until each is adopted and connected."""
        first = len(self.roots) + 1
        roots = [self.state_dir / "sim" / f"node-{n:02d}" for n in range(first, first + count)]
        for attempt in range(30):  # a join during a gateway or API restart is refused: retry
            try:
                join_simulated(self.plane.api, [r for r in roots
                                                 if joined_config(Paths(r)) is None],
                                variant="gpu", pool_id=self.plane.ids["poolId"],
                                server=self.plane.url, env=self.env)
                break
            except CliError as error:
                if attempt == 29:
                    raise
                self.echo(f"  a join was refused ({str(error).splitlines()[-1][:120]}); "
                          "retrying")
                time.sleep(2.0)
        for root in roots:
            link = self.network.link(root.name, (HOST, self.plane.gateway_port))
            env = agent_environment(self.env)
            env["BCD_SIM_GATEWAY"] = f"{HOST}:{link.port}"
            if self.options.places:
                index = int(root.name.removeprefix("node-")) - 1
                env["BCD_TOPOLOGY"] = self.options.places[index % len(self.options.places)]
            if "journal" in self.options.without:
                env["BCD_SIM_FORGET_COMMANDS"] = "1"
            self.agent_env[root.name] = env
            with self.lock:
                self.stack.start([sys.executable, "-m", "bcd", "--root", str(root), "node"],
                                 env, name=f"sim-{root.name}")
        self.roots += roots
        ids = [self._node_id(root) for root in roots]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self._watch()
            try:
                listed = self.plane.api.call("nodes.list", {"poolId": self.plane.ids["poolId"],
                                                            "limit": 1000})["items"]
            except CliError:  # the API is restarting
                listed = []
            nodes = {n["id"]: n for n in listed}
            if all(nodes.get(i, {}).get("provisionState") == "adopted"
                   and nodes[i]["connectivity"] == "connected" for i in ids):
                with self.workload.lock:
                    self.workload.nodes += ids
                return
            time.sleep(0.3)
        raise RuntimeError(f"simulated machines {ids} were not adopted within 60 s")

    def _node_id(self, root: Path) -> str:
        config = joined_config(Paths(root))
        if config is None:
            raise RuntimeError(f"{root} did not join")
        return config.node_id

    def _watch(self) -> None:
        """Restart what died, as `dev` does: the stack's children and the database."""
        with self.lock:
            if not self.planned_restart.is_set():
                self.database.watch()
            self.stack.watch()

    def stop(self, *, keep_ledger: bool = False) -> None:
        """Stop everything; with `keep_ledger`, a stopped copy of the database is left in
        the state folder's `postgres` (start it with `pg_ctl -D` to read what went wrong)."""
        if not hasattr(self, "server"):  # the start failed before anything ran: its error
            return  # is what the caller sees, not this stop's
        with contextlib.suppress(Exception):
            self.workload.close()
        if hasattr(self, "stack"):
            self.stack.stop()
        power_off_simulated_vms(self.state_dir)
        if hasattr(self, "network"):
            self.network.close()
        if keep_ledger:  # this run's, never an earlier run's in the same folder
            shutil.rmtree(self.state_dir / "postgres", ignore_errors=True)
            self.server.save_copy(self.state_dir / "postgres")
        self.server.stop()

    # --- the run -----------------------------------------------------------------------

    def drive(self) -> None:
        """Every operation, join and fault at its (scaled) time, each on a thread of the
        pool; I1 is checked every few seconds while they run."""
        timeline: list[tuple[float, Callable[[], None]]] = []
        timeline += [(op.at, partial(self.workload.apply, op)) for op in self.plan.operations]
        timeline += [(at, partial(self.join, 1)) for at in self.plan.joins]
        for fault in self.plan.faults:
            timeline.append((fault.at, partial(self.inject, fault)))
            if fault.kind == "partition":
                timeline.append((fault.at + fault.duration,
                                 partial(self.network.set, fault.target, "pass")))
        timeline.sort(key=lambda item: item[0])
        started = time.monotonic()
        next_check = started + CHECK_EVERY
        with ThreadPoolExecutor(max_workers=16) as pool:
            futures = []
            for at, action in timeline:
                while time.monotonic() < started + at / self.scale:
                    self._watch()
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + CHECK_EVERY
                        pool.submit(self._check_i1)
                    time.sleep(0.05)
                futures.append(pool.submit(self._guarded, action))
            while time.monotonic() < started + self.plan.seconds / self.scale:
                self._watch()
                time.sleep(0.1)
            while not all(f.done() for f in futures):
                self._watch()
                time.sleep(0.1)

    def _guarded(self, action: Callable[[], None]) -> None:
        """One step of the timeline; what goes wrong in it is reported, and the run goes on
        (the invariants are what judges the run)."""
        try:
            action()
        except Exception as error:
            self.echo(f"  a step failed: {type(error).__name__}: {str(error)[:200]}")
            self.workload.count(f"step failed: {type(error).__name__}")

    def _check_i1(self) -> None:
        found = ledger_checks(self.env, [], [])
        if found and found["I1"]:
            self.i1_problems += found["I1"]
        if found and found.get("I7"):
            self.i7_problems += found["I7"]

    def inject(self, fault: Fault) -> None:
        at = round(fault.at, 1)
        outcome = self._inject(fault)
        self.echo(f"  t={at:7.1f}s  {fault.describe()}: {outcome}")
        self.report.faults.append({"at": at, "fault": fault.describe(), "outcome": outcome})

    def _inject(self, fault: Fault) -> str:
        agent = f"sim-{fault.target}"
        if fault.kind == "kill-agent" or fault.kind in ("kill-gateway", "kill-api",
                                                         "kill-worker"):
            name = agent if fault.kind == "kill-agent" else fault.target
            with self.lock:
                return "killed" if self.stack.kill(name) else "not running"
        if fault.kind in ("kill-agent-before-act", "kill-agent-after-act"):
            return self._kill_mid_command(fault)
        if fault.kind == "journal-loss":
            with self.lock:
                self.stack.kill(agent)
                (Paths(self.state_dir / "sim" / fault.target).state_dir
                 / "journal.jsonl").unlink(missing_ok=True)
            return "killed, journal deleted"
        if fault.kind == "partition":
            self.network.set(fault.target, fault.mode, delay=2.0)
            return f"{fault.mode} until t={fault.at + fault.duration:.0f}s"
        if fault.kind == "postgres-restart":
            with self.lock:  # not restarted by the watch meanwhile
                if not self.server.postmaster_alive():
                    return "not running (the watch restarts it)"
                self.planned_restart.set()
            try:
                self.server.halt()
                time.sleep(1.0)
                self.server.start()
            except RuntimeError:
                if self.server.postmaster_alive():
                    raise
                return "killed while it stopped (the watch restarts it)"
            finally:
                self.planned_restart.clear()
            return "stopped and started"
        if fault.kind == "postgres-kill":
            with self.lock:
                pid = self.server.postmaster_pid()
                if pid is None or not self.server.postmaster_alive():
                    return "not running"
                os.kill(pid, signal.SIGKILL)
            return "postmaster killed (restarted as dev does)"
        if fault.kind == "clock-skew":
            env = {**self.agent_env[fault.target],
                   "BCD_SIM_CLOCK_SKEW_SECONDS": str(fault.skew)}
            self.agent_env[fault.target] = env
            with self.lock:
                self.stack.kill(agent, env=env)
            return "restarted with a skewed clock"
        raise ValueError(f"unknown fault {fault.kind}")

    def _kill_mid_command(self, fault: Fault) -> str:
        """Queue a pausing `sim.mark` and kill the agent inside the pause: after it journaled
        the command and before it acted, or after it acted and before it reported."""
        root = self.state_dir / "sim" / fault.target
        before = fault.kind.endswith("before-act")
        command = self.workload.mark(self._node_id(root),
                                     **{"pauseBefore" if before else "pauseAfter": 3.0})
        if command is None:
            return "no command queued (database away)"
        journal = Paths(root).state_dir / "journal.jsonl"
        log = Paths(root).state_dir / "executions.log"
        deadline = time.monotonic() + DELIVERY_WAIT
        while time.monotonic() < deadline:
            seen = log if not before else journal
            if seen.exists() and command in seen.read_text():
                time.sleep(0.2)
                with self.lock:
                    self.stack.kill(f"sim-{fault.target}")
                return f"killed mid {command}"
            time.sleep(0.05)
        return f"{command} not delivered in {DELIVERY_WAIT:.0f} s (node away); not killed"

    def judge(self) -> None:
        """After the faults: heal the network, then wait for I3; record every invariant."""
        self.network.heal()
        started = time.monotonic()
        joined = [self._node_id(root) for root in self.roots]
        found: dict[str, Any] | None = None
        while time.monotonic() < started + self.options.converge_within:
            self._watch()
            found = ledger_checks(self.env, self.roots, joined, SETTLE)
            if found is not None and not found["I3"]:
                break
            time.sleep(1.0)
        converged = time.monotonic() - started
        found = found or {"I1": ["the ledger could not be read"], "I3": ["unread"],
                          "I4": ["unread"], "I5": ["unread"], "I7": ["unread"], "looked": {}}
        twice, executions = commands_run_twice(self.roots)
        decisions = iam_decisions(self.state_dir / "iam-decisions.log")
        fleet = {origin: n for origin, n in decisions.items()
                 if origin not in FLEET_ORIGINS_EXCLUDE}
        inv = self.report.invariants
        inv["I1"] = _result(self.i1_problems + found["I1"], "no device booked twice, host "
                            "counters equal the claims (checked every 5 s and at the end)")
        inv["I2"] = _result(twice, f"no command run twice ({executions} executions logged)")
        looked = found.get("looked", {})
        inv["I3"] = _result(found["I3"], (
            f"converged {converged:.1f} s after the last fault" if not found["I3"] else
            f"not converged in {self.options.converge_within:.0f} s")
            + f" ({looked.get('active', 0)} active reservations"
            f", {looked.get('holds', 0)} holds on the machines)")
        inv["I4"] = _result(found["I4"], "nothing released, cancelled or re-placed for "
                            "liveness alone")
        inv["I5"] = _result(found["I5"], f"all {len(joined)} machines kept, none retired")
        fence_problems, fenced, live = self.workload.workloads.judge(SETTLE)
        inv["I6"] = _result(fence_problems, f"{fenced} workload(s) stopped at their hold's end "
                            f"and named by their node ({live} ran on until their hold was "
                            "released at the end)")
        inv["I7"] = _result(self.i7_problems + found["I7"], (
            f"no gang partly held ({looked.get('gangs', 0)} multi-node reservations; checked "
            "every 5 s and at the end)"))
        inv["IAM"] = _result([f"{n} IAM decision(s) by {origin}" for origin, n in fleet.items()],
                             f"0 IAM decisions on the fleet path "
                             f"({decisions.get('api', 0)} by the API for tenants)")
        self.report.outcomes = dict(self.workload.outcomes)


def _result(problems: list[str], summary: str) -> dict[str, Any]:
    seen = list(dict.fromkeys(problems))  # a problem found by several checks, once
    return {"ok": not seen, "summary": summary, "problems": seen[:20]}


def run(options: Options, echo: Callable[[str], None] = print) -> Report:
    """One whole run; the state folder is removed afterwards unless one was given."""
    state_dir = options.state_dir or Path(tempfile.mkdtemp(prefix=f"bc-sim-{options.seed}-"))
    sim = Run(options, echo)
    began = time.monotonic()
    echo(f"seed {options.seed}: {options.nodes} nodes, {options.minutes:g} simulated minutes "
         f"at x{options.time_scale:g}, {len(sim.plan.faults)} faults, "
         f"{len(sim.plan.operations)} operations"
         + (f", without {' and '.join(sorted(options.without))}" if options.without else ""))
    try:
        sim.start(state_dir)
        sim.drive()
        sim.judge()
    finally:
        sim.stop(keep_ledger=options.state_dir is not None)
        if options.state_dir is None:
            shutil.rmtree(state_dir, ignore_errors=True)
    sim.report.seconds = round(time.monotonic() - began, 1)
    return sim.report

