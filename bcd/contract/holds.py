"""The hold contract: what a held allocation is called on a node.

A NodeSpec names each hold by its allocation id and lists GPU and MIG UUIDs, and for a
time-sliced booking the shares it holds of those GPUs (`GPU-…:share-2`), nothing more. Every
name with a path or a unit in it (the CDI spec file, the env file, the systemd slice) is
derived here from the validated id, on the agent's side, so a spec (or whoever forged one)
cannot point bcd's writes anywhere else. The control plane derives the same names to show
them, from the same code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bcd.contract import ids

CDI_KIND = "bcd.dev/gpu"
ENV_DIR = "/run/bcd/allocations"
DEVICE_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9][A-Za-z0-9-]{0,94}$")
# A Slurm account or partition name (what Slurm accepts, and nothing a shell would read).
SLURM_ACCOUNT = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
SHARE = re.compile(r"^(GPU-[A-Za-z0-9][A-Za-z0-9-]{0,80}):share-([1-9][0-9]?)$")
ON_END = ("notify", "fence")  # what the node does with a hold's workloads when it ends
MAX_FENCE_GRACE = 30.0  # seconds: the agent waits this long at most before SIGKILL


def share_uuid(gpu_uuid: str, slot: int) -> str:
    """The name of one time-sliced share of a GPU (its device row's UUID in the ledger)."""
    return f"{gpu_uuid}:share-{slot}"


def _is_time(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


class BadHold(ValueError):
    """A spec entry that is not a well-formed hold; the agent applies none of that spec."""


@dataclass(frozen=True)
class SlurmPublish:
    """A hold the node's Slurm offers to one account until the hold's end: a Slurm
    reservation named after the reservation, on the node's GPUs that the hold holds."""

    account: str
    partition: str = ""
    until: str = ""  # ISO 8601: the Slurm reservation's end (the hold's window end)

    @classmethod
    def from_wire(cls, where: str, entry: object) -> SlurmPublish:
        if not isinstance(entry, dict):
            raise BadHold(f"{where}: slurm must be an object")
        account, partition = entry.get("account"), entry.get("partition", "")
        until = entry.get("until", "")
        if not isinstance(account, str) or not re.match(SLURM_ACCOUNT, account):
            raise BadHold(f"{where}: slurm.account is not a Slurm account name")
        if not isinstance(partition, str) or (partition and not re.match(SLURM_ACCOUNT,
                                                                         partition)):
            raise BadHold(f"{where}: slurm.partition is not a Slurm partition name")
        if not isinstance(until, str) or not _is_time(until):
            raise BadHold(f"{where}: slurm.until must be an ISO 8601 time")
        return cls(account, partition, until)

    def wire(self) -> dict[str, str]:
        return {"account": self.account, "partition": self.partition, "until": self.until}


@dataclass(frozen=True)
class Hold:
    allocation_id: str
    reservation_id: str
    gpus: tuple[str, ...]
    kubernetes: bool = False
    shares: tuple[str, ...] = ()  # time-sliced shares of the held GPUs
    preempt_at: str = ""  # ISO 8601: the hold is preempted then (a notice beside its env file)
    slurm: SlurmPublish | None = None
    ends_at: str = ""  # ISO 8601: when the reservation ends (its workloads are told)
    on_end: str = "notify"  # fence: the node stops the hold's workloads when it ends
    fence_grace: float = 10.0  # seconds between SIGTERM and SIGKILL
    notices: tuple[float, ...] = (900.0, 60.0)  # seconds before ends_at: the ending file

    @classmethod
    def from_wire(cls, entry: object) -> Hold:
        """Validate one `allocations[]` entry of a NodeSpec."""
        if not isinstance(entry, dict):
            raise BadHold("a hold must be an object")
        try:
            allocation_id = ids.parse(entry.get("allocationId"), expect="alloc")
            reservation_id = ids.parse(entry.get("reservationId"), expect="rsv")
        except ids.InvalidId as error:
            raise BadHold(str(error)) from None
        gpus = entry.get("gpus")
        if not isinstance(gpus, list) or not gpus or not all(
                isinstance(g, str) and DEVICE_UUID.match(g) for g in gpus):
            raise BadHold(f"{allocation_id}: gpus must be a list of GPU-/MIG- UUIDs")
        if len(set(gpus)) != len(gpus):
            raise BadHold(f"{allocation_id}: a GPU is listed twice")
        kubernetes = entry.get("kubernetes", False)
        if not isinstance(kubernetes, bool):
            raise BadHold(f"{allocation_id}: kubernetes must be true or false")
        shares = entry.get("shares", [])
        if not isinstance(shares, list) or len(set(shares)) != len(shares) or not all(
                isinstance(n, str) and (m := SHARE.match(n)) and m.group(1) in gpus
                for n in shares):
            raise BadHold(f"{allocation_id}: shares must name shares of the held GPUs, once")
        preempt_at = entry.get("preemptAt", "")
        if not isinstance(preempt_at, str) or (preempt_at and not _is_time(preempt_at)):
            raise BadHold(f"{allocation_id}: preemptAt must be an ISO 8601 time")
        ends_at = entry.get("endsAt", "")
        if not isinstance(ends_at, str) or (ends_at and not _is_time(ends_at)):
            raise BadHold(f"{allocation_id}: endsAt must be an ISO 8601 time")
        on_end = entry.get("onEnd", "notify")
        if on_end not in ON_END:
            raise BadHold(f"{allocation_id}: onEnd must be one of {', '.join(ON_END)}")
        grace = entry.get("fenceGraceSeconds", 10.0)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not (
                0 <= grace <= MAX_FENCE_GRACE):
            raise BadHold(f"{allocation_id}: fenceGraceSeconds must be a number from 0 to "
                          f"{MAX_FENCE_GRACE:g}")
        notices = entry.get("endingNotices", [900.0, 60.0])
        if not isinstance(notices, list) or len(notices) > 8 or not all(
                isinstance(n, int | float) and not isinstance(n, bool) and 0 < n <= 7 * 86_400
                for n in notices):
            raise BadHold(f"{allocation_id}: endingNotices must be at most 8 numbers of "
                          "seconds, up to a week")
        slurm = entry.get("slurm")
        return cls(allocation_id, reservation_id, tuple(gpus), kubernetes, tuple(shares),
                   preempt_at,
                   None if slurm is None else SlurmPublish.from_wire(allocation_id, slurm),
                   ends_at, on_end, float(grace),
                   tuple(sorted((float(n) for n in notices), reverse=True)))

    def wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"allocationId": self.allocation_id,
                                "reservationId": self.reservation_id, "gpus": list(self.gpus),
                                "kubernetes": self.kubernetes}
        if self.shares:
            wire["shares"] = list(self.shares)
        if self.preempt_at:
            wire["preemptAt"] = self.preempt_at
        if self.slurm:
            wire["slurm"] = self.slurm.wire()
        if self.ends_at:
            wire["endsAt"] = self.ends_at
        if self.on_end != "notify":  # left out otherwise: the previous agent reads none
            wire["onEnd"], wire["fenceGraceSeconds"] = self.on_end, self.fence_grace
        if self.notices != (900.0, 60.0):
            wire["endingNotices"] = list(self.notices)
        return wire

    @property
    def cdi_devices(self) -> list[str]:
        return sorted(f"{CDI_KIND}={uuid}" for uuid in self.gpus)

    @property
    def cdi_spec_name(self) -> str:
        return f"bcd-{self.allocation_id}.json"

    @property
    def env_file(self) -> str:
        return f"{ENV_DIR}/{self.allocation_id}.env"

    @property
    def notice_file(self) -> str:
        """Written while the hold is being preempted: `{"reservationId", "preemptAt"}`, as a
        cloud's spot notice; a workload watches for it."""
        return f"{ENV_DIR}/{self.allocation_id}.preempt"

    @property
    def ending_file(self) -> str:
        """Written at each of the hold's notice times before its end: `{"reservationId",
        "endsAt", "noticeSeconds"}` (the notice now due); gone when an extension moves the
        end past every notice, and with the hold."""
        return f"{ENV_DIR}/{self.allocation_id}.ending"

    def notice_due(self, now: datetime) -> float | None:
        """The nearest of the notices whose time has come (None before the first, or
        without an end)."""
        if not self.ends_at:
            return None
        left = (datetime.fromisoformat(self.ends_at) - now).total_seconds()
        due = [n for n in self.notices if left <= n]
        return min(due) if due and left > 0 else None

    @property
    def slice_name(self) -> str:
        return f"bcd-alloc-{self.allocation_id}.slice"

    @property
    def cgroupfs_path(self) -> str:
        """The cgroup parent where systemd does not run (a runtime's cgroupfs manager
        refuses a slice name)."""
        return f"/bcd/alloc-{self.allocation_id}"

    @property
    def env(self) -> dict[str, str]:
        """What a workload of the hold is told (the env file, and the CDI spec's edits)."""
        env = {"BCD_ALLOCATION_ID": self.allocation_id, "BCD_PREEMPT_NOTICE": self.notice_file,
               "BCD_ENDING_NOTICE": self.ending_file}
        if self.ends_at:
            env["BCD_ENDS_AT"] = self.ends_at  # moved by an extension (the file is rewritten)
        return {**env, "BCD_GPU_SHARES": ",".join(self.shares)} if self.shares else env

    def binding(self) -> dict[str, Any]:
        """What the node reports (signed) that it holds, and what the ledger shows."""
        binding = {"allocationId": self.allocation_id, "cdiDevices": self.cdi_devices,
                   "envFile": self.env_file, "cgroupParent": self.slice_name}
        return {**binding, "shares": list(self.shares)} if self.shares else binding


@dataclass
class Claims:
    """What the holds of one spec take of the machine, checked before any is written: the
    node's own second look at what the ledger's constraints already refuse. A hold takes
    whole GPUs, MIG instances or shares of a GPU; a whole GPU excludes any part of it."""

    present: set[str]  # healthy GPUs and their MIG instances
    parent: dict[str, str]  # MIG instance -> its GPU
    atoms: dict[str, str] = field(default_factory=dict)  # atom -> allocation
    whole: dict[str, str] = field(default_factory=dict)  # GPU held whole -> allocation
    split: dict[str, set[str]] = field(default_factory=dict)  # GPU -> allocations of parts

    @classmethod
    def of(cls, gpus: list[dict[str, Any]]) -> Claims:
        healthy = [g for g in gpus if g.get("health", "healthy") == "healthy"]
        parent = {m["uuid"]: g["uuid"] for g in healthy for m in g.get("mig", [])}
        return cls(present={g["uuid"] for g in healthy} | set(parent), parent=parent)

    def take(self, allocation: str, hold: Hold) -> str:
        """The hold's atoms, or why it cannot have them (device-missing, overlap)."""
        if not set(hold.gpus) <= self.present:
            return "device-missing"
        parts = [(share, share.partition(":share-")[0]) for share in hold.shares] or [
            (uuid, self.parent.get(uuid, uuid)) for uuid in hold.gpus]
        for atom, gpu in parts:
            whole = atom == gpu
            others = self.split.get(gpu, set()) - {allocation}
            if self.atoms.get(atom, allocation) != allocation \
                    or self.whole.get(gpu, allocation) != allocation or (whole and others):
                return "overlap"
        for atom, gpu in parts:
            self.atoms[atom] = allocation
            if atom == gpu:
                self.whole[gpu] = allocation
            else:
                self.split.setdefault(gpu, set()).add(allocation)
        return ""


def holds_under(root: Path) -> dict[str, Hold]:
    """The holds whose env files are under a machine's root, read back from them: what the
    node holds whatever its journal says (a lost journal forgets holds whose files stay)."""
    found = {}
    for env_file in sorted((root / ENV_DIR.lstrip("/")).glob("alloc_*.env")):
        values = dict(line.partition("=")[::2] for line in env_file.read_text().splitlines())
        try:
            found[env_file.stem] = Hold.from_wire({
                "allocationId": env_file.stem,
                "reservationId": values.get("BCD_RESERVATION_ID", ""),
                "gpus": [g for g in values.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if g],
                "shares": [s for s in values.get("BCD_GPU_SHARES", "").split(",") if s]})
        except BadHold:
            continue  # not a file this agent wrote
    return found
