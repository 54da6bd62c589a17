"""QEMU on the node: which accelerator works, starting a VM, and controlling it over QMP.

Each VM lives in `var/lib/bcd/vms/<sandbox id>/`: its copy-on-write disk, its console log,
its QMP socket, QEMU's pidfile and the exit status. QEMU runs in a session of its own
(under a systemd scope in the sandbox's slice where systemd runs), so an agent that dies
or restarts leaves it running and adopts it again by its pidfile. QEMU locks its pidfile,
so a second QEMU for the same sandbox cannot start.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcd.config import Paths
from bcd.contract.vms import Vm

QEMU = "qemu-system-x86_64"
AGENT_PORT = "org.qemu.guest_agent.0"
PROBE_SECONDS = 5.0
MACHINE = {"kvm": ["-machine", "q35", "-cpu", "host"], "tcg": ["-machine", "q35", "-cpu", "max"]}
START_SECONDS = 30.0
CONSOLE_LIMIT = 4 << 20  # bytes of console log read back at most


# Where the agents of one host keep the probe's answer for this boot of it (one per user).
PROBE_CACHE = Path(tempfile.gettempdir()) / f"bcd-accelerator-{os.getuid()}.json"


def probe_accelerator(*, timeout: float = PROBE_SECONDS, cache: Path | None = PROBE_CACHE
                      ) -> str:
    """`kvm` when a guest really runs under KVM, `tcg` when only emulation works, `none`
    without QEMU (or qemu-img, which makes the VMs' disks). On some virtual machines
    /dev/kvm exists but a nested guest hangs or QEMU aborts, and on some the firmware runs
    under KVM while a Linux kernel hangs as it enters long mode: the probe boots the host's
    own kernel (without a root, so it panics and QEMU exits) under KVM, with the machine
    and CPU model VMs get, and waits for its banner; without a kernel in /boot it boots the
    firmware alone and waits for its first output.

    The guest is booted once per boot of the host (the answer is kept in `cache`): the
    agents of one host (the simulated machines of `dev`) wait for the one probing rather
    than each boot a guest, which on a hung nested KVM spins a core until the timeout."""
    if shutil.which(QEMU) is None or shutil.which("qemu-img") is None:
        return "none"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    try:
        key = _host_key()
    except OSError:
        cache = None
    if cache is None:
        return _probe_kvm(timeout)
    return once_per_boot(cache, key, lambda: _probe_kvm(timeout))


def _probe_kvm(timeout: float) -> str:
    kernels = sorted(Path("/boot").glob("vmlinuz-*"))
    if kernels:
        guest = ["-m", "256", "-kernel", str(kernels[-1]), "-append",
                 "console=ttyS0 panic=-1", "-serial", "stdio"]
        alive = b"Linux version"
    else:
        guest = ["-m", "64", "-chardev", "stdio,id=bios", "-device",
                 "isa-debugcon,iobase=0x402,chardev=bios"]
        alive = b"SeaBIOS"
    probe = [QEMU, "-accel", "kvm", *MACHINE["kvm"], "-nodefaults", "-display", "none",
             "-no-reboot", *guest]
    return "kvm" if prints(probe, alive, timeout=timeout) else "tcg"


def _host_key() -> str:
    """This boot of the host and its /dev/kvm (a module reloaded makes a new one)."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    kvm = os.stat("/dev/kvm")
    return f"{boot}/{kvm.st_rdev}/{kvm.st_ino}/{kvm.st_ctime_ns}"


def once_per_boot(cache: Path, key: str, probe: Callable[[], str]) -> str:
    """`probe()`'s answer kept in `cache` under `key`: the first caller probes while the
    others wait on a lock beside it, then read its answer. A cache that is not this user's
    own, or is of another key, is probed again; with nowhere to keep it, each caller
    probes for itself."""
    try:
        lock = os.open(cache.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                       0o600)
    except OSError:
        return probe()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if cache.lstat().st_uid == os.getuid():
                kept = json.loads(cache.read_text())
                if kept["key"] == key:
                    return str(kept["answer"])
        answer = probe()
        written = cache.with_name(f"{cache.name}.{os.getpid()}")
        with contextlib.suppress(OSError):
            written.write_text(json.dumps({"key": key, "answer": answer}))
            os.replace(written, cache)
        return answer
    finally:
        os.close(lock)  # and with it the lock


def prints(command: list[str], marker: bytes, *, timeout: float) -> bool:
    """Whether `command` prints `marker` on its standard output within `timeout` seconds.
    A hung guest never exits by itself: coreutils' timeout kills it even when the caller is
    killed mid-probe, and the caller kills the whole group when it gives up."""
    if shutil.which("timeout"):
        command = ["timeout", "--signal=KILL", str(math.ceil(timeout) + 1), *command]
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return False
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return marker in output


@dataclass(frozen=True)
class VmFiles:
    folder: Path

    @classmethod
    def of(cls, paths: Paths, sandbox_id: str) -> VmFiles:
        return cls((paths.state_dir / "vms" / sandbox_id).absolute())  # QEMU runs in it

    @property
    def disk(self) -> Path:
        return self.folder / "disk.qcow2"

    @property
    def console(self) -> Path:
        return self.folder / "console.log"

    @property
    def qmp(self) -> Path:
        return self.folder / "qmp.sock"

    @property
    def agent(self) -> Path:
        """The host end of the guest agent's virtio-serial port."""
        return self.folder / "qga.sock"

    @property
    def pidfile(self) -> Path:
        return self.folder / "qemu.pid"

    @property
    def exit_status(self) -> Path:
        return self.folder / "exit-status"


def qemu_argv(vm: Vm, files: VmFiles, *, accel: str, kernel: Path, initrd: Path,
              identity: str | None = None) -> list[str]:
    """QEMU's command line for `vm`. A VM restored from a snapshot must have the devices
    and kernel command line of the guest that was saved: `identity` is then that guest's
    name (the snapshot's), and the VM learns its own once restored."""
    network = ["-netdev", "user,id=net0" + "".join(
        f",hostfwd=tcp:{vm.listen}:{host}-:{guest}" for host, guest in vm.forwards),
        "-device", "virtio-net-pci,netdev=net0"] if vm.network == "outbound" else []
    return [QEMU, "-name", f"{vm.sandbox_id},process=bcd-{vm.sandbox_id}",
            "-accel", accel, *MACHINE[accel],
            "-smp", str(vm.vcpus), "-m", str(vm.memory_mib),
            "-kernel", str(kernel), "-initrd", str(initrd),
            "-append", f"console=ttyS0 quiet panic=-1 bc.sandbox={identity or vm.sandbox_id}",
            "-nodefaults", "-display", "none", "-no-reboot",
            "-chardev", f"file,id=console,path={files.console}", "-serial", "chardev:console",
            "-qmp", f"unix:{files.qmp.name},server=on,wait=off",  # relative: see qmp()
            "-pidfile", str(files.pidfile),
            "-drive", f"file={files.disk},if=virtio,format=qcow2",
            "-device", "virtio-serial-pci,id=serial0",
            "-chardev", f"socket,id=agent,path={files.agent.name},server=on,wait=off",
            "-device", f"virtserialport,chardev=agent,name={AGENT_PORT}",
            *network]


class QemuFailed(RuntimeError):
    """QEMU could not be started; the message says why."""


def prepare_disk(vm: Vm, files: VmFiles, base: Path | None, *, base_format: str = "raw"
                 ) -> None:
    """The VM's own disk: a qcow2 overlay over the image's disk (or a snapshot's), or an
    empty one."""
    files.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if files.disk.exists():
        return  # made before a restart
    args = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if base is not None:
        args += ["-b", str(base), "-F", base_format]
    args += [str(files.disk.with_suffix(".tmp"))]
    if base is None:
        args.append(f"{vm.disk_gib}G")
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise QemuFailed(f"qemu-img could not create the disk: {done.stderr.strip()[-200:]}")
    files.disk.with_suffix(".tmp").rename(files.disk)


def launch(vm: Vm, files: VmFiles, argv: list[str], *, slice_name: str | None,
           timeout: float = START_SECONDS) -> None:
    """Start QEMU detached from the agent (a shell around it writes its exit status) and
    return once its pidfile names it, or once it has already exited."""
    files.exit_status.unlink(missing_ok=True)
    files.console.unlink(missing_ok=True)
    command = ["/bin/sh", "-c", '"$@"; echo $? > "$0"', str(files.exit_status), *argv]
    if slice_name is not None:
        command = ["systemd-run", "--scope", "--quiet", f"--unit={vm.unit_name}",
                   f"--slice={slice_name}", *command]
    log = (files.folder / "qemu.err").open("ab")
    try:
        wrapper = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   start_new_session=True, close_fds=True, cwd=files.folder)
    except OSError as error:
        raise QemuFailed(f"cannot run {QEMU}: {error}") from None
    finally:
        log.close()
    deadline = time.monotonic() + timeout
    while running_pid(files) is None and wrapper.poll() is None:
        if time.monotonic() > deadline:
            os.killpg(wrapper.pid, signal.SIGKILL)
            raise QemuFailed(f"QEMU did not start within {timeout:.0f} s")
        time.sleep(0.05)


def running_pid(files: VmFiles) -> int | None:
    """QEMU's pid when the process in its pidfile is still this sandbox's QEMU."""
    try:
        pid = int(files.pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    if b"qemu" not in cmdline or str(files.pidfile).encode() not in cmdline:
        return None
    status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return None if status and status[0] == "Z" else pid


def exit_status(files: VmFiles) -> int | None:
    try:
        return int(files.exit_status.read_text().strip())
    except (OSError, ValueError):
        return None


def console_tail(files: VmFiles, lines: int) -> list[str]:
    try:
        with files.console.open("rb") as handle:
            handle.seek(max(0, files.console.stat().st_size - CONSOLE_LIMIT))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    cleaned = [line.rstrip("\r") for line in text.replace("\x1b[6n", "").splitlines()]
    return cleaned[-lines:] if lines else []


def console_has(files: VmFiles, line: str) -> bool:
    try:
        return line.encode() in files.console.read_bytes()[-CONSOLE_LIMIT:]
    except OSError:
        return False


def qmp(files: VmFiles, command: str, arguments: dict[str, Any] | None = None, *,
        timeout: float = 5.0) -> dict[str, Any]:
    """One QMP command (after the capabilities handshake); its `return` object.

    A socket's path must fit in 108 bytes, which a simulated machine's deep root can
    exceed: QEMU binds it relative to the VM's folder, and it is reached here through
    that folder's descriptor."""
    folder = os.open(files.folder, os.O_PATH)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(timeout)
            sock.connect(f"/proc/self/fd/{folder}/{files.qmp.name}")
            return _converse(sock, command, arguments)
    finally:
        os.close(folder)


def _converse(sock: socket.socket, command: str, arguments: dict[str, Any] | None
              ) -> dict[str, Any]:
    stream = sock.makefile("rw")
    stream.readline()  # the greeting
    for name, args in (("qmp_capabilities", None), (command, arguments)):
        request: dict[str, Any] = {"execute": name}
        if args is not None:
            request["arguments"] = args
        stream.write(json.dumps(request) + "\n")
        stream.flush()
        while True:
            answer = json.loads(stream.readline() or "{}")
            if "return" in answer or "error" in answer or not answer:
                break  # skip asynchronous events
    if "error" in answer:
        raise QemuFailed(f"QMP {command}: {answer['error'].get('desc', answer['error'])}")
    result = answer.get("return", {})
    return result if isinstance(result, dict) else {}


def stop(files: VmFiles, *, grace: float) -> None:
    """ACPI shutdown, then QMP quit after `grace` seconds, then SIGKILL."""
    pid = running_pid(files)
    if pid is None:
        return
    for step in ("system_powerdown", "quit"):
        with contextlib.suppress(OSError, ValueError, QemuFailed):
            qmp(files, step)
        deadline = time.monotonic() + (grace if step == "system_powerdown" else 5.0)
        while time.monotonic() < deadline:
            if running_pid(files) is None:
                return
            time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while running_pid(files) is not None and time.monotonic() < deadline:
        time.sleep(0.1)


def remove(files: VmFiles) -> None:
    """Remove the VM's folder; its wrapper shell may still write the exit status into it
    just after QEMU ended, so look again."""
    for _ in range(10):
        shutil.rmtree(files.folder, ignore_errors=True)
        if not files.folder.exists():
            return
        time.sleep(0.2)
