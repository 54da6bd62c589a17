"""The node profile: the software units the pool's policy names, kept by bcd on its machine
(desired state, by spec generation) and reported with their state in the inventory and in
`bcd status`. A unit's work is journaled (begin, done) and idempotent; a unit that cannot
work says why and touches nothing else: holds are bound whatever a unit's state.

- container-toolkit: NVIDIA's CDI spec, `/etc/cdi/nvidia.json` named by GPU UUID, made by
  `nvidia-ctk` and made again when the driver or the GPUs change.
- slurmd: the node's Slurm daemon offering the GPUs of a hold asked with `--slurm`
  (bcd.slurm), and nothing while no such hold is here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from bcd import slurm
from bcd.cdi import BadCdiSpec, read_spec_file
from bcd.config import Paths
from bcd.contract.holds import Hold
from bcd.contract.profile import CONTAINER_TOOLKIT, SLURMD, UnitState
from bcd.journal import Journal

CTK_TIMEOUT = 120


class NodeProfile:
    def __init__(self, paths: Paths, journal: Journal, *, slurm_name: str,
                 holds: Callable[[], dict[str, Hold]],
                 gpus: Callable[[], list[dict[str, Any]]]) -> None:
        self.paths, self.journal = paths, journal
        self.slurm = slurm.SlurmNode(paths, slurm_name)
        self.holds, self.gpus = holds, gpus
        self.units: tuple[str, ...] = ()
        self.generation = 0
        self.states: dict[str, UnitState] = {}
        self.wanted = threading.Event()  # set when the spec changed what is wanted
        self._lock = threading.Lock()  # one convergence at a time

    def want(self, units: tuple[str, ...], generation: int) -> None:
        """What the newest spec names; converged by `converge` (off the event loop). The
        profile's generation is that of the spec that last changed its units (a spec that
        only adds or drops a hold keeps it, so the report does not churn)."""
        if units != self.units or not self.generation:
            self.units, self.generation = units, generation
        self.wanted.set()

    def converge(self, units: tuple[str, ...] | None = None) -> dict[str, UnitState]:
        """Bring each wanted unit (or `units`) to its state; returns the states. A unit the
        spec no longer names is left as it is, but a published Slurm hold is withdrawn."""
        with self._lock:
            self.wanted.clear()
            chosen = self.units if units is None else units
            if SLURMD not in chosen and self.slurm.published() is not None:
                self._slurmd()  # no slurmd unit: withdraw what it offered
            for unit in chosen:
                try:
                    state, reason = (self._container_toolkit if unit == CONTAINER_TOOLKIT
                                     else self._slurmd)()
                except (OSError, ValueError, subprocess.SubprocessError) as error:
                    # A unit's trouble is its own: it never takes the agent down.
                    state, reason = "failed", f"{type(error).__name__}: {error}"
                before = self.states.get(unit)
                if before is None or (before.state, before.reason, before.generation) != (
                        state, reason[:300], self.generation):  # `at`: when it last changed
                    self.states[unit] = UnitState(state, reason[:300], self.generation,
                                                  datetime.now(timezone.utc).isoformat())
            for gone in set(self.states) - set(self.units) - set(chosen):
                del self.states[gone]
            return {unit: self.states[unit] for unit in chosen}

    def report(self) -> dict[str, Any]:
        """As the inventory carries it: the spec generation and each unit's state."""
        return {"generation": self.generation,
                "units": {unit: state.wire() for unit, state in sorted(self.states.items())}}

    def check(self, units: list[str]) -> tuple[str, dict[str, Any]]:
        """The acceptance check of the pool's required units: converged now, all ready."""
        states = self.converge(tuple(u for u in units if u in (CONTAINER_TOOLKIT, SLURMD)))
        not_ready = {unit: f"{s.state}: {s.reason}" for unit, s in states.items()
                     if s.state != "ready"}
        if not_ready or len(states) != len(units):
            unknown = sorted(set(units) - set(states))
            reason = "; ".join([*(f"{u} {why}" for u, why in not_ready.items()),
                                *(f"{u} is not a unit" for u in unknown)])
            return "failed", {"error": f"profile: {reason}", "units": _wire(states)}
        return "succeeded", {"units": _wire(states)}

    def _container_toolkit(self) -> tuple[str, str]:
        tool = shutil.which("nvidia-ctk")
        if tool is None:
            return "unavailable", "nvidia-ctk not found (install the NVIDIA Container Toolkit)"
        output = self.paths.cdi_dir / "nvidia.json"
        fingerprint = self._driver_and_gpus()
        last = self.journal.state("unit", CONTAINER_TOOLKIT) or {}
        if last.get("phase") == "done" and last.get("fingerprint") == fingerprint \
                and last.get("state") == "ready" and output.exists():
            return "ready", str(last.get("reason", ""))
        self.journal.begin("unit", CONTAINER_TOOLKIT, fingerprint=fingerprint)
        output.parent.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run([tool, "cdi", "generate", f"--output={output}",
                                   "--format=json", "--device-name-strategy=uuid"],
                                  capture_output=True, text=True, timeout=CTK_TIMEOUT,
                                  check=False)
            if done.returncode != 0:
                words = (done.stderr or done.stdout).strip().splitlines()
                raise BadCdiSpec(f"nvidia-ctk cdi generate failed ({done.returncode}): "
                                 f"{words[-1] if words else ''}")
            spec = read_spec_file(output)
            state, reason = "ready", (f"{output} names {len(spec['devices'])} devices by "
                                      f"UUID ({fingerprint.split('|')[0] or 'driver unknown'})")
        except (BadCdiSpec, subprocess.TimeoutExpired, OSError) as failure:
            state, reason = "failed", str(failure)
        self.journal.done("unit", CONTAINER_TOOLKIT, fingerprint=fingerprint, state=state,
                          reason=reason)
        return state, reason

    def _driver_and_gpus(self) -> str:
        """What the vendor spec depends on: the driver's version and the GPUs."""
        try:
            driver = (self.paths.root / "sys/module/nvidia/version").read_text().strip()
        except OSError:
            driver = ""
        uuids = sorted(str(g.get("uuid")) for g in self.gpus())
        return f"driver {driver}|{','.join(uuids)}" if driver else f"|{','.join(uuids)}"

    def _slurmd(self) -> tuple[str, str]:
        absent = slurm.missing()
        if absent:
            return "unavailable", absent
        wanted = sorted((h for h in self.holds().values() if h.slurm is not None),
                        key=lambda h: h.allocation_id) if SLURMD in self.units else []
        current = self.slurm.published()
        try:
            if current is not None and current.allocation_id not in {
                    h.allocation_id for h in wanted}:
                self.journal.begin("slurm-withdraw", current.allocation_id)
                self.slurm.withdraw()
                self.journal.done("slurm-withdraw", current.allocation_id)
            if not wanted:
                unreachable = slurm.controller_reachable()
                return ("failed", unreachable) if unreachable else (
                    "ready", "no Slurm hold on this node")
            hold = wanted[0]
            files = self._device_files(hold)
            self.journal.begin("slurm-publish", hold.allocation_id)
            published = self.slurm.publish(hold, files)
            self.journal.done("slurm-publish", hold.allocation_id)
        except slurm.SlurmFailed as failure:
            return "failed", str(failure)
        waiting = [h.reservation_id for h in wanted[1:]]
        return "ready", published.describe() + (
            f"; waiting (one Slurm hold per node at a time): {', '.join(waiting)}"
            if waiting else "")

    def _device_files(self, hold: Hold) -> list[str]:
        """Each held GPU's device file, as the hold's CDI spec resolves it."""
        try:
            spec = json.loads((self.paths.cdi_dir / hold.cdi_spec_name).read_text())
        except (OSError, ValueError) as error:
            raise slurm.SlurmFailed(f"the hold's CDI spec cannot be read: {error}") from None
        by_name = {d["name"]: d.get("containerEdits", {}) for d in spec.get("devices", [])}
        files = []
        for uuid in hold.gpus:
            nodes = [n for n in by_name.get(uuid, {}).get("deviceNodes", [])
                     if "/nvidia" in n.get("path", "")]
            if not nodes:
                raise slurm.SlurmFailed(f"{uuid} has no device file in the hold's CDI spec")
            files.append(nodes[0].get("hostPath") or nodes[0]["path"])
        return files


def _wire(states: dict[str, UnitState]) -> dict[str, Any]:
    return {unit: state.wire() for unit, state in states.items()}
