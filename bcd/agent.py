"""`bcd node`: keep a session with the gateway, report, run commands, serve `bcd status`.

One asyncio task group owns every task. The session reconnects with jittered exponential
backoff; nothing held on the node is dropped while disconnected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bcd import checks, sandbox_exec
from bcd.cdi import BadCdiSpec, vendor_spec
from bcd.config import VARIABLES, Config, SimFaults, Tuning, write_private
from bcd.contract.crypto import canonical, sign_bytes
from bcd.contract.holds import BadHold, Claims, Hold
from bcd.contract.profile import units_of
from bcd.contract.vms import Vm
from bcd.deploys import Deploys, serve_deploys
from bcd.deviceplugin import GpuSource, run_device_plugin
from bcd.fence import end_workloads
from bcd.holds import (
    FALLBACK,
    SliceFailed,
    holds_on_disk,
    remove_hold,
    slice_stop_if_empty,
    write_ending_notice,
    write_hold,
)
from bcd.inventory import inventory_for
from bcd.join.client import published_gateway
from bcd.journal import Journal
from bcd.notify import sd_notify, watchdog_seconds
from bcd.profile import NodeProfile
from bcd.provision import Site, run_bmc
from bcd.session import AgentSession, Credentials
from bcd.unclean import Unclean
from bcd.vms import VmKeeper

logger = logging.getLogger("bcd")
UNIX_PATH_MAX = 107  # sun_path's 108 bytes, less the final NUL
REDISCOVER_AFTER = 2  # sessions in a row without a Welcome before the gateway is looked up


@dataclass
class Converged:
    """What applying a spec's holds made: the reports of what it changed, the `bound`
    reports that only repeat a hold it left as it was, and the VMs and profile units it
    wants."""

    machines: list[Vm]
    units: tuple[str, ...]
    changed: list[tuple[str, str, str]] = field(default_factory=list)
    repeated: list[tuple[str, str, str]] = field(default_factory=list)


class Agent:
    def __init__(self, config: Config, tuning: Tuning | None = None, *,
                 provisioner: bool = False, deploy_listen: str = "",
                 place: str | None = None, events_looked_at: bool = False) -> None:
        self.faults = SimFaults.from_env(config.sim)
        if self.faults.gateway:  # the simulator's proxy stands for the network to the gateway
            config = replace(config, gateway=self.faults.gateway)
        if self.faults.clock_skew_seconds:
            _skew_wall_clock(self.faults.clock_skew_seconds)
        self.config = config
        self.provisioner = provisioner  # runs `bmc.*` commands for its site's machines
        self.deploy_listen = deploy_listen  # where deploy ramdisks ask for their instructions
        self.place = place  # its place in the fabric, when not BCD_TOPOLOGY's (bcd.many)
        # GPU events: a thread of its own waits for them, unless another looks (bcd.many)
        self.events_looked_at = events_looked_at
        self.site: Site | None = None
        self.tuning = tuning or Tuning.from_env()
        self.paths = config.paths
        self.inventory = inventory_for(sim=config.sim, sim_gpus=config.sim_gpus,
                                       root=str(config.paths.root.resolve()),
                                       sim_variant=config.sim_variant,
                                       hostname=config.hostname or config.node_id)
        self.session: AgentSession | None = None
        self.journal = Journal(self.paths.state_dir / "journal.jsonl")
        self.busy_slices: dict[str, Hold] = {}  # released holds whose slice still runs
        self.unclean = Unclean.load(self.paths.state_dir / "unclean.json")
        self.ending_notices: dict[str, float | None] = {}  # the notice each hold was given
        # The signed reports of the last spec applied, sent again on every new session: one
        # sent on a session that died before its gateway took it would be lost, and the
        # control plane treats a repeat as a no-op.
        self.spec_reports: list[tuple[str, str, str]] = []
        self.spec_applied_here = False  # see hello_generation
        self._key: ec.EllipticCurvePrivateKey | None = None
        self._last_inventory = b""
        self._inventory: dict[str, Any] | None = None
        self._telemetry: dict[str, dict[str, float]] = {}
        self.vms = VmKeeper(paths=self.paths, journal=self.journal, node_id=config.node_id,
                            sign=self._signed, send=self._send_reports)
        self.profile = NodeProfile(self.paths, self.journal,
                                   slurm_name=config.hostname or config.node_id,
                                   holds=self.held,
                                   gpus=lambda: self.current_inventory().get("gpus", []))

    def _send_reports(self, reports: list[tuple[str, str, str]]) -> None:
        """Reports made outside a spec's application (VMs): sent if a session is up, and
        again by VmKeeper on the next session's welcome."""
        if self.session is not None and self.session.state.connected:
            self.session.send_reports(reports)

    def credentials(self) -> Credentials:
        return Credentials(key=self.node_key(),
                           certificate_pem=self.paths.cert_file.read_bytes(),
                           ca_pem=self.paths.ca_file.read_bytes())

    async def run_command(self, command_id: str, kind: str,
                          payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Run a one-shot command at most once, whatever crashes or redeliveries happen.
        A read (a VM's console) changes nothing on the node and is simply answered."""
        if kind in READS:
            return await asyncio.to_thread(READS[kind], self, payload)
        seen = None if self.faults.forget_commands else self.journal.state("command", command_id)
        if seen is not None and seen["phase"] == "done":
            return seen["status"], seen["output"]  # a redelivery: report, do not rerun
        if seen is not None:
            started = self.journal.state("exec", command_id)
            if started is None:
                return "unknown", {"error": "the agent stopped while running it; not run again"}
            status, output = await asyncio.to_thread(  # the same run, waited for again
                sandbox_exec.answering, lambda: sandbox_exec.exec_finish(
                    self.paths, payload, started["pid"], started["deadline"]))
            self.journal.done("command", command_id, status=status, output=output)
            return status, output
        self.journal.begin("command", command_id, commandKind=kind)
        self._log_execution(command_id, kind)
        if kind == "vm.exec":
            status, output = await asyncio.to_thread(sandbox_exec.answering, lambda: (
                sandbox_exec.exec_start(self.paths, payload, lambda pid, deadline: (
                    self.journal.done("exec", command_id, pid=pid, deadline=deadline)))))
        else:
            status, output = await self._execute(kind, payload)
        self.journal.done("command", command_id, status=status, output=output)
        return status, output

    def _log_execution(self, command_id: str, kind: str) -> None:
        """Append the command to the execution log, a file apart from the journal that
        nothing here reads back: the record of what ran, for whoever audits the node (the
        fleet simulator counts commands run twice from it)."""
        fd = os.open(self.paths.state_dir / "executions.log",
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps({"command": command_id, "kind": kind,
                                      "epoch": self.journal.epoch}) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    async def _execute(self, kind: str, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        diagnostics: dict[str, Callable[[], tuple[str, dict[str, Any]]]] = {
            "diag.nvml": lambda: checks.diag_nvml(self.inventory, payload),
            "diag.cpu": lambda: checks.diag_cpu(self.inventory, payload),
            "diag.disk": lambda: checks.diag_disk(self.paths.state_dir, payload),
            "diag.network": lambda: checks.diag_network(self.gateway_now(), payload),
            "diag.dcgm": lambda: checks.diag_dcgm(payload),
        }
        if kind in diagnostics:  # they read hardware and files: off the event loop
            return await asyncio.to_thread(diagnostics[kind])
        if kind.startswith("bmc.") and self.provisioner:  # blocking HTTP to a BMC
            return await asyncio.to_thread(run_bmc, kind, payload, self.node_key(), self.site)
        if kind == "profile.check":
            units = (payload.get("params") or {}).get("units", [])
            return await asyncio.to_thread(self.profile.check,
                                           units if isinstance(units, list) else [])
        if kind == "vm.put":
            return await asyncio.to_thread(sandbox_exec.answering,
                                           lambda: sandbox_exec.put(self.paths, payload))
        if kind == "sim.mark" and self.config.sim:
            return await self._mark(payload)
        return "failed", {"error": f"unknown command {kind}"}

    async def _mark(self, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A simulated one-shot side effect (appends a line), for crash tests: it can pause
        before acting and after acting, so a kill -9 can land in either gap."""
        await asyncio.sleep(float(payload.get("pauseBefore", 0)))
        marks = self.paths.state_dir / "marks"
        with marks.open("a") as handle:
            handle.write(f"{payload.get('mark', 'x')}\n")
            handle.flush()
            os.fsync(handle.fileno())
        await asyncio.sleep(float(payload.get("pauseAfter", 0)))
        return "succeeded", {"marked": payload.get("mark", "x")}

    def node_key(self) -> ec.EllipticCurvePrivateKey:
        if self._key is None:
            key = serialization.load_pem_private_key(self.paths.key_file.read_bytes(), None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{self.paths.key_file} is not an EC private key")
            self._key = key
        return self._key

    def _signed(self, kind: str, payload: dict[str, Any]) -> tuple[str, str, str]:
        body = canonical(payload).decode()
        return kind, body, sign_bytes(self.node_key(), body.encode())

    def apply_spec(self, generation: int, spec: dict[str, Any]) -> list[tuple[str, str, str]]:
        """Converge the node to `spec`: write new holds, remove dropped ones, journaled.

        Holds are idempotent, so a step begun before a crash is simply done again. Returns
        the reports to send now: what this spec changed (holds new or changed, released,
        failed); the first spec a process applies reports every hold, as does each new
        session (`spec_reports`, the whole list), so a report lost with a session or a
        process is made again, while a spec that adds one hold to a busy node costs the
        control plane one report, not one per hold. A spec with any malformed hold is
        refused whole (BadHold): nothing of it is applied.
        """
        converged = self._converge(generation, spec)
        return self._converged(generation, converged) if converged else []

    async def apply_spec_off_loop(self, generation: int,
                                  spec: dict[str, Any]) -> list[tuple[str, str, str]]:
        """`apply_spec` with the holds' work in a thread: files, the journal's fsyncs, and
        the search for (and fencing of) what ran under a released hold, which reads every
        process's open files and may wait out a grace period. The event loop, and every
        other agent on it, carries on; the session waits, so specs apply one at a time."""
        converged = await asyncio.to_thread(self._converge, generation, spec)
        return self._converged(generation, converged) if converged else []

    def _converge(self, generation: int, spec: dict[str, Any]) -> Converged | None:
        """The holds' part of `apply_spec` (None: an older generation, nothing done)."""
        if generation < self.journal.applied_generation():
            return None
        entries = spec.get("allocations", [])
        if not isinstance(entries, list):
            raise BadHold("allocations must be a list")
        wanted = {hold.allocation_id: hold for hold in map(Hold.from_wire, entries)}
        vms = spec.get("vms", [])
        if not isinstance(vms, list):
            raise BadHold("vms must be a list")
        machines = [Vm.from_wire(entry) for entry in vms]  # BadVm refuses the whole spec
        units = units_of(spec)  # BadProfile refuses the whole spec
        self.journal.begin("spec", str(generation), generation=generation)
        done = Converged(machines, units)
        report = self.current_inventory()
        gpu_index = {g["uuid"]: g["index"] for g in report.get("gpus", [])}
        before = self.held()
        for allocation, hold in before.items():
            if allocation not in wanted:
                self.journal.begin("unhold", allocation)
                # Before anything else may hold its devices: fenced, or named if left running.
                workloads = end_workloads(hold, self.paths, gpu_index)
                if workloads.get("survived"):  # its GPUs go to no one while they run
                    self.unclean.mark(hold, workloads["survived"])
                if not remove_hold(hold, self.paths):
                    self.busy_slices[allocation] = hold
                self.journal.done("unhold", allocation, workloads=workloads)
                done.changed.append(self._signed("released", {
                    "allocationId": allocation, "generation": generation,
                    "nodeId": self.config.node_id, "workloads": workloads}))
        claims = Claims.of(report.get("gpus", []))
        self.unclean.prune()
        for allocation, hold in list(wanted.items()):
            problem = claims.take(allocation, hold) or (
                "" if allocation in before else self.unclean.refusal(hold))
            if problem:
                del wanted[allocation]
                done.changed.append(self._signed("failed", {
                    "allocationId": allocation, "generation": generation,
                    "nodeId": self.config.node_id, "reason": problem}))
        for allocation, hold in wanted.items():
            self.journal.begin("hold", allocation)
            try:
                bound = write_hold(hold, self.paths, gpu_index)
            except (BadCdiSpec, SliceFailed) as refusal:
                reason = f"{'cdi' if isinstance(refusal, BadCdiSpec) else 'slice'}: {refusal}"
                self.journal.done("hold-refused", allocation, reason=reason)
                done.changed.append(self._signed("failed", {
                    "allocationId": allocation, "generation": generation,
                    "nodeId": self.config.node_id, "reason": reason[:200]}))
                continue
            self.journal.done("hold", allocation, hold=hold.wire())
            said = done.repeated if before.get(allocation) == hold else done.changed
            said.append(self._signed("bound", {**bound, "generation": generation,
                                               "nodeId": self.config.node_id}))
        self.journal.done("spec", str(generation), generation=generation)
        return done

    def _converged(self, generation: int, done: Converged) -> list[tuple[str, str, str]]:
        """The rest of `apply_spec`, on the event loop: VMs and the profile, and what to
        report."""
        self.vms.want(done.machines)
        self.profile.want(done.units, generation)
        every = done.changed + done.repeated
        first = not self.spec_applied_here
        self.spec_reports, self.spec_applied_here = every, True
        return every if first else done.changed

    def hello_generation(self) -> int:
        """The generation a new session says it applied: the journal's once this process
        applied a spec, else 0, so that the gateway sends the newest spec again and its
        reports (lost with the process that made them) are made and sent anew."""
        return self.journal.applied_generation() if self.spec_applied_here else 0

    def cdi_source(self) -> str:
        """Where new holds take their device edits from (or why they cannot be made)."""
        try:
            vendor = vendor_spec(self.paths.root)
        except BadCdiSpec as refusal:
            return f"refused: {refusal}"
        return vendor.source if vendor is not None else FALLBACK

    def held(self) -> dict[str, Hold]:
        """What the journal says this node holds (written by this agent, so well-formed),
        and the holds whose files are on disk though the journal forgot them (it was lost):
        held all the same, so a spec that no longer names them removes them."""
        journaled = {allocation: Hold.from_wire(hold)
                     for allocation, hold in self.journal.held().items()}
        return {**holds_on_disk(self.paths), **journaled}

    def status(self) -> dict[str, Any]:
        state = self.session.state if self.session else None
        report = self.current_inventory()
        held_by = {uuid: allocation for allocation, hold in self.held().items()
                   for uuid in hold.gpus}
        readings = self._telemetry
        return {
            "nodeId": self.config.node_id, "siteId": self.config.site_id,
            "gateway": self.gateway_now(),
            "session": {"connected": bool(state and state.connected),
                        "epoch": state.epoch if state else 0},
            "generations": {"applied": self.journal.applied_generation(),
                            "observed": self.session.applied_generation if self.session else 0},
            "sections": {"inventory": "reported" if state and state.connected else "pending",
                         "holds": f"{len(self.journal.held())} held"},
            "holds": [{"allocationId": allocation, "reservationId": hold.reservation_id,
                       "gpus": list(hold.gpus), "preemptAt": hold.preempt_at or None,
                       "endsAt": hold.ends_at or None, "onEnd": hold.on_end,
                       "endingNotice": self.ending_notices.get(allocation)}
                      for allocation, hold in sorted(self.held().items())],
            "cdi": self.cdi_source(),
            "simulated": self.config.sim,
            "virtualization": self.vms.accelerator or "probing",
            "vms": self.vms.status(),
            "profile": self.profile.report(),
            "gpus": [{"index": g["index"], "uuid": g["uuid"], "product": g["product"],
                      "health": g.get("health", "healthy"),
                      "healthReason": g.get("healthReason", ""),
                      **readings.get(g["uuid"], {"utilization": 0, "temperatureC": 0,
                                                 "powerW": 0, "memoryUsedMiB": 0}),
                      "heldBy": held_by.get(g["uuid"])}
                     for g in report.get("gpus", [])],
        }

    async def serve_status(self) -> None:
        path = self.paths.socket
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(json.dumps(self.status()).encode())
            await writer.drain()
            writer.close()

        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            raise OSError(f"the status socket {path} is longer than a Unix socket path may "
                          f"be ({UNIX_PATH_MAX} bytes): give the machine a shorter --root")
        server = await asyncio.start_unix_server(answer, path=str(path))
        path.chmod(0o600)
        async with server:
            await server.serve_forever()

    def gateways(self) -> list[str]:
        """The session gateways, in the order this node tries them: the list starts at a
        place of its own (so that nodes spread over them) and goes round."""
        targets = [target for target in self.config.gateway.split(",") if target]
        start = zlib.crc32(self.config.node_id.encode()) % max(len(targets), 1)
        return targets[start:] + targets[:start]

    def gateway_now(self) -> str:
        """The gateway of the session now (or the one tried next)."""
        if self.session is not None:
            return self.session.target
        return (self.gateways() or [""])[0]

    async def keep_session(self) -> None:
        """Keep a session open. A session lost or refused is tried again on the next
        gateway (after a jittered backoff, reset by a session that lasted a minute), so a
        node whose gateway died is connected through another within about a second."""
        delay = 1.0
        unwelcomed = 0
        turn = 0
        while True:
            targets = self.gateways() or [""]
            self.session = AgentSession(
                credentials=self.credentials(), target=targets[turn % len(targets)],
                inventory=self.inventory, run_command=self.run_command,
                journal_epoch=self.journal.epoch, apply_spec=self.apply_spec_off_loop,
                applied_generation=self.hello_generation(),
                journal_generation=self.journal.applied_generation(),
                spec_pin=self.config.join_signing_pin)
            started = asyncio.get_running_loop().time()
            try:
                reason = await self.session.run(on_welcome=self._welcomed)
                logger.warning("session ended: %s", reason or "closed by the gateway")
            except Exception as error:  # a lost connection: retry
                logger.warning("session lost: %s", error)
            if asyncio.get_running_loop().time() - started > 60:
                delay = 1.0
            unwelcomed = 0 if self.session.state.node_id else unwelcomed + 1
            turn += 1
            if unwelcomed and unwelcomed % REDISCOVER_AFTER == 0:
                await asyncio.to_thread(self.follow_published_gateway)
            await asyncio.sleep(random.uniform(0, delay))  # noqa: S311 (jitter)
            delay = min(self.tuning.backoff_max_seconds, delay * 2)

    def follow_published_gateway(self) -> None:
        """The gateway may have moved: take the address the control plane publishes now. Its
        certificate must still chain to the pinned CA, so a wrong address only fails."""
        if self.faults.gateway:
            return  # the simulator pinned the address
        published = published_gateway(self.config)
        if published and published != self.config.gateway:
            logger.warning("the control plane publishes the gateways %s; moving from %s",
                           published, self.config.gateway)
            self.config = replace(self.config, gateway=published)
            self.config.write(self.paths.config_file)

    async def renew_certificates(self) -> None:
        """Ask for a fresh certificate (same key) over the session before this one expires."""
        margin = timedelta(hours=self.tuning.renew_margin_hours)
        interval = self.tuning.renew_check_seconds
        while True:
            await asyncio.sleep(interval)
            cert = x509.load_pem_x509_certificate(self.paths.cert_file.read_bytes())
            left = cert.not_valid_after_utc - datetime.now(timezone.utc)
            if left < margin and self.session is not None and self.session.state.connected:
                self.session.request_renewal(self.node_key())

    async def keep_ending_notices(self, *, interval: float = 1.0) -> None:
        """Each hold's ending file, written when one of its notices falls due (bcd.holds)."""
        while True:
            now = datetime.now(timezone.utc)
            for hold in list(self.held().values()):
                try:
                    self.ending_notices[hold.allocation_id] = write_ending_notice(
                        hold, self.paths, now)
                except OSError as failure:  # the hold's folder went away: it is being removed
                    logger.debug("ending notice of %s not written: %s", hold.allocation_id,
                                 failure)
            await asyncio.sleep(interval)

    async def stop_empty_slices(self, *, interval: float = 30.0) -> None:
        """A released hold's slice stops once its workload has gone."""
        while True:
            await asyncio.sleep(interval)
            for allocation, hold in list(self.busy_slices.items()):
                if slice_stop_if_empty(hold, self.paths):
                    del self.busy_slices[allocation]

    def _renewed(self, _field: str, pem: bytes) -> None:
        write_private(self.paths.cert_file, pem)
        logger.info("certificate renewed")

    def _welcomed(self, state: Any) -> None:
        logger.info("connected as %s (epoch %s)", state.node_id, state.epoch)
        state.on_renewed = self._renewed
        if self.session is not None:
            self.session.send_inventory(self._inventory_sent_now(self.current_inventory()))
            self.session.send_reports(self.spec_reports)
            self.vms.resend()

    def _inventory_sent_now(self, report: dict[str, Any]) -> dict[str, Any]:
        self._last_inventory = canonical(report)
        return report

    def current_inventory(self) -> dict[str, Any]:
        """The latest inventory `watch_inventory` read (off the event loop); read here only
        before its first pass."""
        if self._inventory is None:
            self._inventory = self._read_inventory()
        return self._inventory

    def _read_pass(self) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
        """One pass of `watch_inventory` off the event loop: inventory, then telemetry."""
        return self._read_inventory(), self.inventory.telemetry()

    def _read_inventory(self) -> dict[str, Any]:
        self.unclean.prune()
        return self.unclean.overlay({
            **self.inventory.report(), "virtualization": self.vms.accelerator or "probing",
            "profile": self.profile.report(), **topology_report(self.place)})

    async def keep_profile(self, *, interval: float = 30.0) -> None:
        """Converge the profile's units when the spec changes them (or a hold comes or
        goes), and again every `interval` (a driver update, a controller back up)."""
        since = interval
        while True:
            if self.profile.wanted.is_set() or since >= interval:
                await asyncio.to_thread(self.profile.converge)
                since = 0.0
            await asyncio.sleep(0.25)
            since += 0.25

    async def watch_inventory(self) -> None:
        """Read inventory, health and telemetry off the event loop (NVML and nvidia-smi
        block) and send the inventory when it changed: a GPU that turns unhealthy reaches the
        ledger in seconds. Telemetry goes every `telemetry_seconds`."""
        telemetry_sent = 0.0
        while True:
            report, self._telemetry = await asyncio.to_thread(self._read_pass)
            self._inventory = report
            session = self.session
            if session is not None and \
                    time.monotonic() - telemetry_sent >= self.tuning.telemetry_seconds and \
                    session.send_telemetry(self._telemetry):
                telemetry_sent = time.monotonic()
            if session is not None and session.state.connected \
                    and canonical(report) != self._last_inventory:
                sick = [g["index"] for g in report.get("gpus", [])
                        if g.get("health") != "healthy"]
                logger.info("inventory changed (unhealthy GPUs: %s): sending it",
                            sick or "none")
                session.send_inventory(self._inventory_sent_now(report))
            await asyncio.sleep(self.tuning.inventory_check_seconds)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run until SIGINT or SIGTERM, or until `stop` is set when one is given: then the
        caller runs several agents and owns the signals and systemd's notifications."""
        alone = stop is None
        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
        if not self.events_looked_at:
            self.inventory.start_watching()  # XID events, on a thread of their own
        if self.provisioner and self.deploy_listen:
            self.site = Site(deploys=Deploys(), join={
                "server": self.config.server, "servingCaPin": self.config.serving_ca_pin,
                "joinSigningPin": self.config.join_signing_pin,
                "joinEncryptionPin": self.config.join_encryption_pin})
            serve_deploys(self.site.deploys, self.deploy_listen)
        works = [self.serve_status(), self.keep_session(), self.renew_certificates(),
                 self.stop_empty_slices(), self.keep_ending_notices(), self.watch_inventory(),
                 self.device_plugin(), self.vms.run(), self.keep_profile()]
        interval = watchdog_seconds() if alone else None
        if interval is not None:
            works.append(self.ping_watchdog(interval))
        tasks = [asyncio.create_task(work) for work in works]
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.sleep(0)  # the status socket is bound before READY is said
            if alone:
                sd_notify(f"READY=1\nSTATUS=node {self.config.node_id}")
            # Until a signal, or until one of its tasks fails (that failure is raised).
            done, _ = await asyncio.wait([stopping, *tasks],
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopping:
                    task.result()
        finally:
            if alone:
                sd_notify("STOPPING=1")
            for task in [stopping, *tasks]:
                task.cancel()
            await asyncio.gather(stopping, *tasks, return_exceptions=True)

    async def device_plugin(self) -> None:
        """The Kubernetes device plugin: idle until a kubelet's socket appears in its
        device-plugins folder (BCD_DEVICE_PLUGIN_DIR, default /var/lib/kubelet/...)."""
        folder = VARIABLES.text("BCD_DEVICE_PLUGIN_DIR")
        await run_device_plugin(GpuSource(self.held, self.current_inventory),
                                root=self.paths.root,
                                directory=Path(folder) if folder else None)

    async def ping_watchdog(self, interval: float) -> None:
        """Ping systemd's watchdog from the event loop: if the loop hangs, pings stop and
        systemd restarts the agent (the journal makes that safe)."""
        while True:
            sd_notify("WATCHDOG=1")
            await asyncio.sleep(interval)



# Commands that only read (a VM's console, a command's output, a file): simply answered.
READS: dict[str, Callable[[Agent, dict[str, Any]], tuple[str, dict[str, Any]]]] = {
    "vm.console": lambda agent, payload: ("succeeded", {"lines": agent.vms.console(
        str(payload.get("sandboxId", "")), min(int(payload.get("lines", 50)), 2000))}),
    "vm.exec-read": lambda agent, payload: sandbox_exec.answering(
        lambda: sandbox_exec.exec_read(agent.paths, payload)),
    "vm.get": lambda agent, payload: sandbox_exec.answering(
        lambda: sandbox_exec.get(agent.paths, payload)),
}

def topology_report(said: str | None = None) -> dict[str, Any]:
    """The machine's place in the fabric (`said`, else `BCD_TOPOLOGY`: `rack=r1,rail=a`),
    for the inventory; nothing when it is not set."""
    said = (VARIABLES.text("BCD_TOPOLOGY") if said is None else said) or ""
    pairs = dict(part.split("=", 1) for part in said.split(",") if "=" in part)
    place = {key: pairs[key].strip() for key in ("rack", "rail") if pairs.get(key, "").strip()}
    return {"topology": place} if place else {}


def _skew_wall_clock(seconds: float) -> None:
    """A simulated machine whose clock is off: its wall clock (what heartbeats and reports
    carry) reads `seconds` ahead or behind; monotonic time, as on a real machine, is not."""
    real = time.time
    time.time = lambda: real() + seconds


def read_status(socket_path: Path) -> dict[str, Any]:
    async def ask() -> dict[str, Any]:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        data = await reader.read()
        writer.close()
        status = json.loads(data)
        if not isinstance(status, dict):
            raise ValueError("the agent's status is not a JSON object")
        return status

    return asyncio.run(ask())


def status_text(status: dict[str, Any]) -> str:
    session = status["session"]
    lines = [f"node        {status['nodeId']} (site {status['siteId']})",
             "session     " + (f"connected (epoch {session['epoch']})" if session["connected"]
                               else "disconnected"),
             f"generations applied {status['generations']['applied']}, observed "
             f"{status['generations']['observed']}"]
    lines += [f"section     {name}: {state}" for name, state in status["sections"].items()]
    lines.append(f"cdi         {status.get('cdi', '')}")
    lines.append(f"virtualization {status.get('virtualization', 'none')}")
    lines += [f"vm          {vm['sandboxId']} {vm['state']}, {vm['vcpus']} vCPUs, "
              f"{vm['memoryMiB']} MiB, pid {vm['pid']}" for vm in status.get("vms", [])]
    lines += [f"hold        {hold['allocationId']} ({hold['reservationId']}), "
              f"{len(hold['gpus'])} GPU(s), ends at {hold['endsAt']}"
              + (", its workloads stopped then" if hold.get("onEnd") == "fence" else "")
              + (f" (notice: {hold['endingNotice']:g} s before)" if hold.get("endingNotice")
                 else "")
              for hold in status.get("holds", []) if hold.get("endsAt")]
    lines += [f"preempting  {hold['allocationId']} ({hold['reservationId']}) at "
              f"{hold['preemptAt']}: its GPUs are taken back then"
              for hold in status.get("holds", []) if hold.get("preemptAt")]
    profile = status.get("profile") or {"units": {}}
    lines += [f"unit        {name} {unit['state']} (generation {unit['generation']})"
              + (f": {unit['reason']}" if unit["reason"] else "")
              for name, unit in profile["units"].items()]
    if status.get("simulated"):
        lines.append("readings    simulated (a simulated machine: no GPU was measured)")
    for gpu in status["gpus"]:
        held = f", held by {gpu['heldBy']}" if gpu["heldBy"] else ""
        health = gpu["health"] + (f" ({gpu['healthReason']})" if gpu.get("healthReason") else "")
        lines.append(f"gpu {gpu['index']}       {gpu['uuid']} {gpu['product']} {health}"
                     f", util {gpu['utilization']:.0f}%, {gpu['temperatureC']:.0f} C, "
                     f"{gpu['powerW']:.0f} W, {gpu['memoryUsedMiB']:.0f} MiB{held}")
    return "\n".join(lines)
