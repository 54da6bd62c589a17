"""Snapshots of a booted guest, per node: a sandbox starts from one in about a second.

A snapshot is made once per shape (the image's parts, vCPUs, memory, network, accelerator):
a guest of that shape is booted apart from any sandbox, waited for until its guest agent
answers, and saved with QEMU's migration to a file (its memory and device state) beside a
copy of its disk. A sandbox of that shape then starts QEMU with the same devices and kernel
command line, `-incoming` from that file, over its own copy-on-write layer of the saved
disk: it resumes where the saved guest was, already booted. Once restored it is given its
own name and the time.

The snapshot's guest never holds anything of a sandbox; agents of one node that want the
same shape at once wait for the one making it (a lock beside it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shlex
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bcd import guest, qemu
from bcd.config import Paths
from bcd.contract.vms import Vm

logger = logging.getLogger("bcd.snapshots")
IDENTITY = "template"  # the saved guest's name, on the kernel command line of every restore
TEMPLATE_ID = "sbx_00000000000000000000000000"  # a well-formed id for the saved guest's VM


@dataclass(frozen=True)
class Snapshot:
    folder: Path

    @property
    def memory(self) -> Path:
        return self.folder / "memory"

    @property
    def disk(self) -> Path:
        return self.folder / "disk.qcow2"

    @property
    def done(self) -> Path:
        return self.folder / "done.json"

    def incoming(self) -> list[str]:
        return ["-incoming", f"exec:cat {shlex.quote(str(self.memory))}"]


def shape_key(vm: Vm, accel: str) -> str:
    parts = [vm.kernel.sha256, vm.initrd.sha256, vm.disk.sha256 if vm.disk else "",
             str(vm.disk_gib), str(vm.vcpus), str(vm.memory_mib), vm.network, accel]
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:32]


def snapshot_for(vm: Vm, paths: Paths, *, accel: str, kernel: Path, initrd: Path,
                 base: Path | None, boot_timeout: float) -> Snapshot:
    """The snapshot of `vm`'s shape, made now if this node has none yet (which takes a cold
    boot). Raises QemuFailed or GuestAgentError where the guest cannot be saved."""
    snapshot = Snapshot((paths.state_dir / "snapshots" / shape_key(vm, accel)).absolute())
    snapshot.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = os.open(snapshot.folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not snapshot.done.exists():
            _make(snapshot, replace(vm, sandbox_id=TEMPLATE_ID, forwards=(),
                                    desired="running"),
                  accel=accel, kernel=kernel, initrd=initrd, base=base,
                  boot_timeout=boot_timeout)
        return snapshot
    finally:
        os.close(lock)


def _make(snapshot: Snapshot, vm: Vm, *, accel: str, kernel: Path, initrd: Path,
          base: Path | None, boot_timeout: float) -> None:
    started = time.monotonic()
    files = qemu.VmFiles(snapshot.folder / "guest")
    shutil.rmtree(files.folder, ignore_errors=True)
    qemu.prepare_disk(vm, files, base)
    argv = qemu.qemu_argv(vm, files, accel=accel, kernel=kernel, initrd=initrd,
                          identity=IDENTITY)
    qemu.launch(vm, files, argv, slice_name=None)
    try:
        deadline = time.monotonic() + boot_timeout
        while not guest.ready(files, timeout=1.0):
            if qemu.running_pid(files) is None or time.monotonic() > deadline:
                raise qemu.QemuFailed("the snapshot's guest did not boot: "
                                      + " | ".join(qemu.console_tail(files, 3)))
            time.sleep(0.2)
        snapshot.memory.unlink(missing_ok=True)
        qemu.qmp(files, "migrate", {"uri": f"exec:cat > {shlex.quote(str(snapshot.memory))}"})
        while (state := qemu.qmp(files, "query-migrate").get("status")) not in (
                "completed", "failed", "cancelled"):
            if time.monotonic() > deadline:
                raise qemu.QemuFailed("saving the snapshot took too long")
            time.sleep(0.05)
        if state != "completed":
            raise qemu.QemuFailed(f"saving the snapshot {state}")
        qemu.stop(files, grace=0)  # paused by the migration: nothing to shut down
        files.disk.rename(snapshot.disk)
        snapshot.done.write_text(json.dumps({
            "bytes": snapshot.memory.stat().st_size,
            "seconds": round(time.monotonic() - started, 2)}))
        logger.info("snapshot of %d vCPUs, %d MiB saved in %.1f s", vm.vcpus, vm.memory_mib,
                    time.monotonic() - started)
    finally:
        with contextlib.suppress(OSError):
            qemu.stop(files, grace=0)
        qemu.remove(files)


def restored_identity(files: qemu.VmFiles, sandbox_id: str) -> None:
    """Give a guest restored from a snapshot its own name, and the time."""
    guest.run_quietly(files, ["/bin/sh", "-c",
                              'hostname "$1"; echo "sandbox $1" > /www/index.html; '
                              'date -s "@$2" >/dev/null', "sh", sandbox_id,
                              str(int(time.time()))])
