"""Sandbox VMs on the node: converge the running QEMUs to the spec's `vms[]`, journaled.

Every step is journaled before it acts (`vm-start`, `vm-stop` begin) and after (done), so
an agent killed mid-start adopts the QEMU it started (found by its pidfile) instead of
starting a second, and one killed mid-stop finishes the stop. What the node reports about
a VM (signed: starting, started, failed, exited, stopped) is kept per sandbox and sent
again on every new session; the control plane treats a repeat as a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcd import guest, images, qemu, snapshots
from bcd.config import VARIABLES, Paths
from bcd.contract.vms import Vm
from bcd.holds import systemd_present
from bcd.journal import Journal

logger = logging.getLogger("bcd.vms")
Report = tuple[str, str, str]  # (kind, json, signature)


@dataclass(frozen=True)
class VmTuning:
    """`BCD_VM_BOOT_TIMEOUT_SECONDS` (a guest that has not said it booted by then fails),
    `BCD_VM_SHUTDOWN_SECONDS` (ACPI shutdown's grace before QEMU is told to quit)."""

    boot_timeout: float = 180.0
    shutdown_grace: float = 20.0

    @classmethod
    def from_env(cls) -> VmTuning:
        return cls(VARIABLES.number("BCD_VM_BOOT_TIMEOUT_SECONDS"),
                   VARIABLES.number("BCD_VM_SHUTDOWN_SECONDS"))


def vm_states(journal: Journal) -> dict[str, dict[str, Any]]:
    """Per sandbox, from the journal: state (launching, starting, running, paused,
    stopping, stopped, ended), the VM, when its start was begun, whether it started from a
    snapshot, whether it was resumed since, and how it ended."""
    states: dict[str, dict[str, Any]] = {}
    for record in journal.records:
        kind, key, phase = record.get("kind"), record.get("key", ""), record.get("phase")
        if kind == "vm-start":
            if phase == "begin":
                states[key] = {"state": "launching", "vm": record["vm"], "at": record["at"]}
            elif key in states:
                states[key].update(state="starting", snapshot=record.get("snapshot", False))
        elif kind == "vm-never" and key not in states:  # released before it was started
            states[key] = {"state": "stopped", "vm": record["vm"], "at": record.get("at", 0)}
        elif key in states and kind == "vm-ready":
            states[key]["state"] = "running"
        elif key in states and kind in ("vm-pause", "vm-resume"):
            states[key].update(state="paused" if kind == "vm-pause" else "running",
                               resumed=kind == "vm-resume")
        elif key in states and kind == "vm-stop":
            states[key]["state"] = "stopping" if phase == "begin" else "stopped"
            if phase != "begin" and "at" in record:
                states[key]["endedAt"] = record["at"]
        elif key in states and kind == "vm-end":
            states[key].update(state="ended", end=record.get("end", "failed"),
                               reason=record.get("reason", ""),
                               exitStatus=record.get("exitStatus"), endedAt=record.get("at"))
    return states


class VmKeeper:
    def __init__(self, *, paths: Paths, journal: Journal, node_id: str,
                 sign: Callable[[str, dict[str, Any]], Report],
                 send: Callable[[list[Report]], None],
                 tuning: VmTuning | None = None) -> None:
        self.paths = paths
        self.journal = journal
        self.node_id = node_id
        self.sign = sign
        self.send = send
        self.tuning = tuning or VmTuning.from_env()
        self.wanted: dict[str, Vm] | None = None  # unknown until this run's first spec
        self.stopping: dict[str, Vm] = {}  # released: desired stopped
        self.accelerator = VARIABLES.text("BCD_VIRTUALIZATION")
        self.reports: dict[str, Report] = {}
        self.wake = asyncio.Event()
        self._rebuild_reports()

    def want(self, vms: list[Vm]) -> None:
        self.wanted = {vm.sandbox_id: vm for vm in vms if vm.desired != "stopped"}
        self.stopping = {vm.sandbox_id: vm for vm in vms if vm.desired == "stopped"}
        self.wake.set()

    def _rebuild_reports(self) -> None:
        """After a restart: what was last said about each VM, to say it again."""
        phase = {"launching": "starting", "starting": "starting", "running": "started",
                 "paused": "paused", "stopping": "", "stopped": "stopped"}
        for sandbox, state in vm_states(self.journal).items():
            said = state.get("end") if state["state"] == "ended" else phase[state["state"]]
            if said == "started" and state.get("resumed"):
                said = "resumed"
            if said:
                self.reports[sandbox] = self._report(sandbox, said, state.get("reason", ""),
                                                     state.get("exitStatus"),
                                                     state.get("endedAt"))

    def _report(self, sandbox: str, phase: str, reason: str = "",
                exit_status: int | None = None, ended_at: float | None = None) -> Report:
        """A signed VM report; one that says the VM ended says when (the node's clock), so
        that a report that arrives late is metered to the end, not to its arrival."""
        payload: dict[str, Any] = {"sandboxId": sandbox, "phase": phase,
                                   "nodeId": self.node_id, "accelerator": self.accelerator}
        if reason:
            payload["reason"] = reason[:300]
        if exit_status is not None:
            payload["exitStatus"] = exit_status
        if ended_at is not None:
            payload["endedAt"] = round(float(ended_at), 3)
        return self.sign("vm", payload)

    def _say(self, sandbox: str, phase: str, reason: str = "",
             exit_status: int | None = None, ended_at: float | None = None) -> None:
        report = self._report(sandbox, phase, reason, exit_status, ended_at)
        self.reports[sandbox] = report
        self.send([report])

    def resend(self) -> None:
        self.send(list(self.reports.values()))

    async def run(self, *, interval: float = 1.0, booting: float = 0.1) -> None:
        """Converge on every change of the spec, every `interval` seconds, and every
        `booting` seconds while a guest boots (its readiness is what a user waits for)."""
        if not self.accelerator:
            self.accelerator = await asyncio.to_thread(qemu.probe_accelerator)
        logger.info("virtualization: %s", self.accelerator)
        while True:
            waiting = any(state["state"] in ("launching", "starting")
                          for state in vm_states(self.journal).values())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(),
                                       timeout=booting if waiting else interval)
            self.wake.clear()
            try:
                await self.converge()
            except Exception:  # one bad pass must not stop the agent; the next retries
                logger.exception("converging VMs failed; retrying")

    async def converge(self) -> None:
        watches = []
        for sandbox, state in vm_states(self.journal).items():
            files = qemu.VmFiles.of(self.paths, sandbox)
            wanted = (self.wanted or {}).get(sandbox)
            unwanted = self.wanted is not None and wanted is None
            live = state["state"] in ("launching", "starting", "running", "paused")
            if (live and unwanted) or state["state"] == "stopping":
                await self._stop(sandbox, files, paused=state["state"] == "paused")
            elif state["state"] == "launching":
                await self._launch(Vm.from_wire(state["vm"]), files, begun=True)
            elif state["state"] in ("starting", "running", "paused"):
                watches.append(self._watch(sandbox, state, files,
                                           wanted.desired if wanted else None))
        await asyncio.gather(*watches)  # each guest is looked at at once, not one by one
        known = vm_states(self.journal)
        for sandbox, vm in list((self.wanted or {}).items()):
            if sandbox not in known:
                await self._launch(vm, qemu.VmFiles.of(self.paths, sandbox), begun=False)
        known = vm_states(self.journal)  # the launches above awaited: the spec may be newer
        for sandbox, vm in list(self.stopping.items()):
            if sandbox not in known:  # released before this node started it
                self.journal.done("vm-never", sandbox, vm=vm.wire(), at=time.time())
                self._say(sandbox, "stopped")

    async def _launch(self, vm: Vm, files: qemu.VmFiles, *, begun: bool) -> None:
        sandbox = vm.sandbox_id
        if not begun:
            self.journal.begin("vm-start", sandbox, vm=vm.wire(), at=time.time())
        elif await asyncio.to_thread(qemu.running_pid, files) is not None:
            logger.info("%s: adopting the QEMU that still runs", sandbox)
            self.journal.done("vm-start", sandbox, adopted=True)
            return
        try:
            if self.accelerator == "none":
                raise qemu.QemuFailed("this node cannot run VMs (no qemu-system-x86_64)")
            kernel = await asyncio.to_thread(images.fetch, vm.kernel, self.paths, "kernel")
            initrd = await asyncio.to_thread(images.fetch, vm.initrd, self.paths, "initrd")
            base = (await asyncio.to_thread(images.fetch, vm.disk, self.paths, "disk")
                    if vm.disk else None)
            snapshot = await self._snapshot(vm, kernel, initrd, base)
            if snapshot is not None:
                await asyncio.to_thread(qemu.prepare_disk, vm, files, snapshot.disk,
                                        base_format="qcow2")
                argv = [*qemu.qemu_argv(vm, files, accel=self.accelerator, kernel=kernel,
                                        initrd=initrd, identity=snapshots.IDENTITY),
                        *snapshot.incoming()]
            else:
                await asyncio.to_thread(qemu.prepare_disk, vm, files, base)
                argv = qemu.qemu_argv(vm, files, accel=self.accelerator, kernel=kernel,
                                      initrd=initrd)
            slice_name = f"{vm.unit_name}.slice" if systemd_present(self.paths) else None
            await asyncio.to_thread(qemu.launch, vm, files, argv, slice_name=slice_name)
        except (images.ImageRefused, qemu.QemuFailed, OSError) as refusal:
            self._end(sandbox, files, "failed", str(refusal))
            return
        self.journal.done("vm-start", sandbox, snapshot=snapshot is not None)
        logger.info("%s: QEMU started (%d vCPUs, %d MiB, %s%s)", sandbox, vm.vcpus,
                    vm.memory_mib, self.accelerator, ", from a snapshot" if snapshot else "")
        self._say(sandbox, "starting")

    async def _snapshot(self, vm: Vm, kernel: Path, initrd: Path,
                        base: Path | None) -> snapshots.Snapshot | None:
        """The snapshot to start `vm` from, where its image asks for one (not with port
        forwards: the saved guest had none); a snapshot that cannot be made means a cold
        boot, not a failed sandbox."""
        if not vm.snapshot or vm.forwards:
            return None
        try:
            return await asyncio.to_thread(
                snapshots.snapshot_for, vm, self.paths, accel=self.accelerator, kernel=kernel,
                initrd=initrd, base=base, boot_timeout=self.tuning.boot_timeout)
        except (qemu.QemuFailed, guest.GuestAgentError, OSError) as error:
            logger.warning("%s: no snapshot (%s); booting cold", vm.sandbox_id, error)
            return None

    async def _watch(self, sandbox: str, state: dict[str, Any], files: qemu.VmFiles,
                     desired: str | None) -> None:
        vm = Vm.from_wire(state["vm"])
        if await asyncio.to_thread(qemu.running_pid, files) is None:
            await asyncio.sleep(0.3)  # the wrapper writes the status just after QEMU exits
            status = qemu.exit_status(files)
            if status is None and time.time() - float(state["at"]) < qemu.START_SECONDS:
                return  # adopted while QEMU was still starting: its pidfile is not there yet
            if state["state"] in ("running", "paused"):
                self._end(sandbox, files, "exited", f"the VM exited on its own (status "
                          f"{status if status is not None else 'unknown'})", status)
            else:
                said = " | ".join(qemu.console_tail(files, 3)) or _qemu_error(files)
                self._end(sandbox, files, "failed", f"QEMU exited (status {status}) before "
                          f"the guest booted: {said}", status)
        elif state["state"] == "starting":
            if await asyncio.to_thread(self._booted, vm, files, state.get("snapshot", False)):
                self.journal.done("vm-ready", sandbox)
                logger.info("%s: the guest booted", sandbox)
                self._say(sandbox, "started")
            elif time.time() - float(state["at"]) > self.tuning.boot_timeout:
                await asyncio.to_thread(qemu.stop, files, grace=0)
                self._end(sandbox, files, "failed", f"the guest did not boot within "
                          f"{self.tuning.boot_timeout:.0f} s")
        elif desired is not None and (state["state"], desired) in (
                ("running", "paused"), ("paused", "running")):
            await self._pause(sandbox, files, pause=desired == "paused")

    @staticmethod
    def _booted(vm: Vm, files: qemu.VmFiles, from_snapshot: bool) -> bool:
        """A cold guest has booted when it printed its ready line; one restored from a
        snapshot when its guest agent answers (then it is given its own name)."""
        if not from_snapshot:
            return qemu.console_has(files, vm.ready_line)
        if not guest.ready(files, timeout=0.5):
            return False
        snapshots.restored_identity(files, vm.sandbox_id)
        return True

    async def _pause(self, sandbox: str, files: qemu.VmFiles, *, pause: bool) -> None:
        """Stop or run again the guest's CPUs (QMP stop / cont): its memory stays."""
        try:
            await asyncio.to_thread(qemu.qmp, files, "stop" if pause else "cont")
        except (OSError, ValueError, qemu.QemuFailed) as error:
            logger.warning("%s: could not %s: %s", sandbox, "pause" if pause else "resume",
                           error)
            return  # the next pass tries again
        self.journal.done("vm-pause" if pause else "vm-resume", sandbox)
        logger.info("%s: %s", sandbox, "paused" if pause else "resumed")
        self._say(sandbox, "paused" if pause else "resumed")

    async def _stop(self, sandbox: str, files: qemu.VmFiles, *, paused: bool = False) -> None:
        """Stop the VM: ACPI shutdown first, except for a paused guest (it cannot hear it)."""
        self.journal.begin("vm-stop", sandbox)
        await asyncio.to_thread(qemu.stop, files,
                                grace=0 if paused else self.tuning.shutdown_grace)
        await asyncio.to_thread(qemu.remove, files)
        ended = time.time()
        self.journal.done("vm-stop", sandbox, at=ended)
        logger.info("%s: stopped", sandbox)
        self._say(sandbox, "stopped", ended_at=ended)

    def _end(self, sandbox: str, files: qemu.VmFiles, end: str, reason: str,
             status: int | None = None) -> None:
        logger.warning("%s: %s: %s", sandbox, end, reason)
        qemu.remove(files)
        ended = time.time()
        self.journal.done("vm-end", sandbox, end=end, reason=reason[:300], exitStatus=status,
                          at=ended)
        self._say(sandbox, end, reason, status, ended)

    def status(self) -> list[dict[str, Any]]:
        return [{"sandboxId": sandbox, "state": state["state"],
                 "vcpus": state["vm"]["vcpus"], "memoryMiB": state["vm"]["memoryMiB"],
                 "pid": qemu.running_pid(qemu.VmFiles.of(self.paths, sandbox))}
                for sandbox, state in vm_states(self.journal).items()
                if state["state"] not in ("stopped", "ended")]

    def console(self, sandbox: str, lines: int) -> list[str]:
        return qemu.console_tail(qemu.VmFiles.of(self.paths, sandbox), lines)


def _qemu_error(files: qemu.VmFiles) -> str:
    try:
        return (files.folder / "qemu.err").read_text()[-300:].strip() or "no output"
    except OSError:
        return "no output"
