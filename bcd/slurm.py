"""A hold published to Slurm: this node's slurmd offers exactly the held GPUs, in a Slurm
reservation for the hold's account, until the hold ends.

Slurm fixes a node's GPU count in the controller's configuration, so bcd runs the node's
slurmd as a dynamic node (`slurmd -Z`) while a Slurm hold is on it, with its own
`slurm.conf` (which includes the site's), a `gres.conf` naming the held GPUs' device files
(resolved from the hold's CDI spec) and a TaskProlog that names the job's GPUs by UUID in
CUDA_VISIBLE_DEVICES (Slurm numbers them by their place in gres.conf). The release cancels
the reservation's jobs, deletes it, stops that slurmd and removes the node from Slurm.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path

from bcd.config import VARIABLES, Paths, write_private
from bcd.contract.holds import Hold

SITE_CONF = "/etc/slurm/slurm.conf"
TOOLS = ("slurmd", "scontrol", "scancel")
REGISTER_SECONDS = 30.0
# Run by slurmstepd before each task: `export` lines it prints set the task's environment.
TASK_PROLOG = """#!/bin/sh
# bcd: name the step's GPUs by UUID (Slurm numbers them by their place in gres.conf).
map="{gpus}"
ids="${{SLURM_STEP_GPUS:-$SLURM_JOB_GPUS}}"
[ -n "$ids" ] || exit 0
uuids=""
for i in $(echo "$ids" | tr ',' ' '); do
  uuid=$(sed -n "$((i + 1))p" "$map")
  uuids="$uuids${{uuids:+,}}$uuid"
done
echo "export CUDA_VISIBLE_DEVICES=$uuids"
echo "export NVIDIA_VISIBLE_DEVICES=$uuids"
"""


class SlurmFailed(RuntimeError):
    """Slurm refused a step; the message has its words."""


@dataclass(frozen=True)
class Published:
    """What this node offers Slurm now (kept in the agent's state folder)."""

    allocation_id: str
    reservation: str  # the Slurm reservation's name: the reservation's id
    account: str
    node: str  # the Slurm node's name
    gpus: tuple[str, ...]  # UUIDs, in gres.conf order
    files: tuple[str, ...]  # their device files
    pid: int  # the slurmd bcd started
    until: str  # the Slurm reservation's end (ISO 8601)

    def describe(self) -> str:
        return (f"{len(self.gpus)} GPUs to account {self.account} in Slurm reservation "
                f"{self.reservation} on node {self.node}")


def site_conf() -> Path:
    return Path(VARIABLES.text("SLURM_CONF") or SITE_CONF)


def missing() -> str:
    """Why this machine cannot publish to Slurm, or "" when it can."""
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not found (install Slurm's slurmd and client)"
    if not site_conf().is_file():
        return f"{site_conf()} not found (the site's slurm.conf; SLURM_CONF names another)"
    return ""


def _run(*argv: str, timeout: float = 20) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise SlurmFailed(f"{' '.join(argv[:3])} did not answer in {timeout:.0f} s") from None
    if done.returncode != 0:
        words = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmFailed(f"{' '.join(argv[:3])}: {words[-1] if words else 'failed'}")
    return done.stdout


def controller_reachable() -> str:
    """"" when the controller answers `scontrol ping`, else why not."""
    try:
        answer = _run("scontrol", "ping", timeout=15)
    except SlurmFailed as failure:
        return str(failure)
    return "" if "UP" in answer else f"scontrol ping: {answer.strip()[:160]}"


class SlurmNode:
    """The Slurm side of this machine: at most one published hold at a time."""

    def __init__(self, paths: Paths, name: str) -> None:
        self.folder = paths.state_dir / "slurm"
        self.name = name

    def published(self) -> Published | None:
        try:
            data = json.loads((self.folder / "published.json").read_text())
            return Published(**{**data, "gpus": tuple(data["gpus"]),
                                "files": tuple(data["files"])})
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def publish(self, hold: Hold, files: list[str]) -> Published:
        """Offer the hold's GPUs (their device `files`, in the hold's GPU order) to its
        account; idempotent: a hold already offered is checked and kept."""
        if hold.slurm is None:
            raise SlurmFailed(f"{hold.allocation_id} is not a Slurm hold")
        current = self.published()
        if current is not None and current.allocation_id == hold.allocation_id \
                and _alive(current.pid) and self._reservation_exists(current.reservation):
            if current.until != hold.slurm.until:  # the reservation was extended
                _run("scontrol", "update", f"ReservationName={current.reservation}",
                     f"EndTime={_slurm_time(hold.slurm.until)}")
                current = replace(current, until=hold.slurm.until)
                self._keep(current)
            return current
        if current is not None:
            self.withdraw()
        self.folder.mkdir(parents=True, exist_ok=True)
        site = site_conf()
        lines = [f"Include {site}", f"TaskProlog={self.folder / 'task-prolog'}"]
        write_private(self.folder / "slurm.conf", "\n".join(lines) + "\n")
        for extra in ("cgroup.conf",):  # read from beside the slurm.conf slurmd is given
            if (site.parent / extra).is_file():
                write_private(self.folder / extra, (site.parent / extra).read_text())
        write_private(self.folder / "gres.conf",
                      "".join(f"Name=gpu File={file}\n" for file in files))
        write_private(self.folder / "gpus", "".join(f"{uuid}\n" for uuid in hold.gpus))
        prolog = self.folder / "task-prolog"
        write_private(prolog, TASK_PROLOG.format(gpus=self.folder / "gpus"))
        prolog.chmod(0o755)
        (self.folder / "gpus").chmod(0o644)
        self.folder.chmod(0o755)  # slurmstepd runs the prolog as the job's user
        process = subprocess.Popen(
            ["slurmd", "-D", "-f", str(self.folder / "slurm.conf"), "-Z", "-N", self.name,
             "--conf", f"Gres=gpu:{len(files)} Feature=bcd"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        published = Published(hold.allocation_id, hold.reservation_id, hold.slurm.account,
                              self.name, hold.gpus, tuple(files), process.pid,
                              hold.slurm.until)
        self._keep(published)
        self._registered(process)
        _run("scontrol", "create", "reservation", f"ReservationName={hold.reservation_id}",
             f"Accounts={hold.slurm.account}", f"Nodes={self.name}", "StartTime=now",
             f"EndTime={_slurm_time(hold.slurm.until)}", "Flags=IGNORE_JOBS",
             *([f"PartitionName={hold.slurm.partition}"] if hold.slurm.partition else []))
        return published

    def _keep(self, published: Published) -> None:
        write_private(self.folder / "published.json", json.dumps(asdict(published)))

    def withdraw(self) -> None:
        """End what is offered: cancel the reservation's jobs, delete it, stop the slurmd
        and take the node out of Slurm. Each step is idempotent; a step that fails raises
        (the next pass tries again)."""
        current = self.published()
        if current is None:
            return
        if self._reservation_exists(current.reservation):
            _run("scancel", f"--reservation={current.reservation}")
            _run("scontrol", "delete", f"ReservationName={current.reservation}")
        _stop(current.pid)
        deadline = time.monotonic() + 30
        while True:  # refused while the cancelled jobs are still ending
            try:
                _run("scontrol", "delete", f"NodeName={self.name}")
                break
            except SlurmFailed as refusal:
                if "Invalid node name" in str(refusal):
                    break  # not (or no longer) in Slurm
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        (self.folder / "published.json").unlink(missing_ok=True)

    def _registered(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + REGISTER_SECONDS
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SlurmFailed(f"slurmd exited ({process.returncode}) before registering "
                                  f"{self.name}; see the site's SlurmdLogFile")
            try:
                shown = _run("scontrol", "show", "node", self.name, "--oneliner")
            except SlurmFailed:
                shown = ""
            state = shown.partition("State=")[2].split(" ", 1)[0]
            if state and not any(bad in state for bad in ("DOWN", "INVALID", "NOT_RESPONDING")):
                return
            time.sleep(0.5)
        raise SlurmFailed(f"slurmd did not register {self.name} in {REGISTER_SECONDS:.0f} s")

    @staticmethod
    def _reservation_exists(name: str) -> bool:
        try:
            _run("scontrol", "show", f"ReservationName={name}")
        except SlurmFailed:
            return False
        return True


def _slurm_time(iso: str) -> str:
    """An ISO 8601 time as scontrol reads it: this machine's local time, no zone."""
    return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def _alive(pid: int) -> bool:
    try:  # our own child that exited: reap it (a zombie still answers kill 0)
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _stop(pid: int) -> None:
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
