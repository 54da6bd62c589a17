"""The sandbox VM contract: what a NodeSpec's `vms[]` entry says, validated on the agent.

A spec names each VM by its sandbox id and gives its size, its image (URL and sha256 of
each part) and its port forwards. Every path and unit name is derived on the agent from the
validated sandbox id, so a spec cannot point bcd's writes anywhere else. The signed reports
a node sends about a VM carry one of PHASES.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bcd.contract import ids

SHA256 = re.compile(r"^[0-9a-f]{64}$")
URL = re.compile(r"^(https?|file)://[^\s\u0000-\u001f\u007f]{1,2000}$")  # no control characters
NETWORKS = ("none", "outbound")  # none: only the guest agent's channel; outbound: user-mode
LISTEN = ("127.0.0.1", "0.0.0.0")  # noqa: S104 (0.0.0.0 only where the pool policy says)
FILE_LIMIT = 2 << 20  # bytes a sandbox put or get carries at most (one signed message)
MAX_VCPUS = 256
MAX_MEMORY_MIB = 4 * 1024 * 1024
# starting: QEMU runs, the guest is booting; started: the guest said it booted;
# failed: it never booted (reason); exited: it stopped on its own; stopped: stopped as asked.
# paused / resumed: the guest's CPUs were stopped / run again as the spec asked.
PHASES = ("starting", "started", "paused", "resumed", "failed", "exited", "stopped")
DESIRED = ("running", "paused", "stopped")


class BadVm(ValueError):
    """A spec entry that is not a well-formed VM; the agent applies none of that spec."""


@dataclass(frozen=True)
class ImagePart:
    url: str
    sha256: str

    @classmethod
    def from_wire(cls, entry: object, what: str) -> ImagePart:
        if not isinstance(entry, dict):
            raise BadVm(f"{what} must be an object with url and sha256")
        url, digest = entry.get("url"), entry.get("sha256")
        if not isinstance(url, str) or not URL.match(url):
            raise BadVm(f"{what}.url must be an http(s):// or file:// URL")
        if not isinstance(digest, str) or not SHA256.match(digest):
            raise BadVm(f"{what}.sha256 must be 64 lowercase hex digits")
        return cls(url, digest)

    def wire(self) -> dict[str, str]:
        return {"url": self.url, "sha256": self.sha256}


def _int(entry: dict[str, Any], name: str, low: int, high: int) -> int:
    value = entry.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadVm(f"{name} must be an integer from {low} to {high}")
    return value


@dataclass(frozen=True)
class Vm:
    sandbox_id: str
    vcpus: int
    memory_mib: int
    kernel: ImagePart
    initrd: ImagePart
    disk: ImagePart | None = None
    disk_gib: int = 1
    ready_line: str = "better-compute guest ready"
    forwards: tuple[tuple[int, int], ...] = ()
    listen: str = "127.0.0.1"
    desired: str = "running"  # "paused", or "stopped": released, kept until the node says so
    network: str = "none"
    snapshot: bool = False  # start from a snapshot of this image's booted guest (per node)

    @classmethod
    def from_wire(cls, entry: object) -> Vm:
        if not isinstance(entry, dict):
            raise BadVm("a VM must be an object")
        try:
            sandbox_id = ids.parse(entry.get("sandboxId"), expect="sbx")
        except ids.InvalidId as error:
            raise BadVm(str(error)) from None
        ready_line = entry.get("readyLine", cls.ready_line)
        if not isinstance(ready_line, str) or not 0 < len(ready_line) <= 200:
            raise BadVm(f"{sandbox_id}: readyLine must be 1 to 200 characters")
        listen = entry.get("listen", "127.0.0.1")
        if listen not in LISTEN:
            raise BadVm(f"{sandbox_id}: listen must be one of {', '.join(LISTEN)}")
        forwards = entry.get("forwards", [])
        if not isinstance(forwards, list) or len(forwards) > 16:
            raise BadVm(f"{sandbox_id}: forwards must be a list of at most 16")
        pairs = tuple((_int(f, "hostPort", 1024, 65535), _int(f, "guestPort", 1, 65535))
                      if isinstance(f, dict) else (0, 0) for f in forwards)
        if (0, 0) in pairs:
            raise BadVm(f"{sandbox_id}: each forward is an object with hostPort and guestPort")
        desired = entry.get("desired", "running")
        if desired not in DESIRED:
            raise BadVm(f"{sandbox_id}: desired must be one of {', '.join(DESIRED)}")
        network = entry.get("network", "none")
        if network not in NETWORKS:
            raise BadVm(f"{sandbox_id}: network must be one of {', '.join(NETWORKS)}")
        if pairs and network != "outbound":
            raise BadVm(f"{sandbox_id}: forwards need network outbound")
        snapshot = entry.get("snapshot", False)
        if not isinstance(snapshot, bool):
            raise BadVm(f"{sandbox_id}: snapshot must be true or false")
        disk = entry.get("disk")
        return cls(sandbox_id, _int(entry, "vcpus", 1, MAX_VCPUS),
                   _int(entry, "memoryMiB", 64, MAX_MEMORY_MIB),
                   ImagePart.from_wire(entry.get("kernel"), "kernel"),
                   ImagePart.from_wire(entry.get("initrd"), "initrd"),
                   ImagePart.from_wire(disk, "disk") if disk is not None else None,
                   _int(entry, "diskGiB", 1, 4096) if "diskGiB" in entry else 1,
                   ready_line, pairs, listen, desired, network, snapshot)

    def wire(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "sandboxId": self.sandbox_id, "vcpus": self.vcpus, "memoryMiB": self.memory_mib,
            "kernel": self.kernel.wire(), "initrd": self.initrd.wire(),
            "diskGiB": self.disk_gib, "readyLine": self.ready_line, "listen": self.listen,
            "desired": self.desired, "network": self.network, "snapshot": self.snapshot,
            "forwards": [{"hostPort": h, "guestPort": g} for h, g in self.forwards]}
        if self.disk is not None:
            entry["disk"] = self.disk.wire()
        return entry

    @property
    def unit_name(self) -> str:
        return f"bcd-sandbox-{self.sandbox_id}"
