"""The small default sandbox image: a distribution kernel and a busybox initramfs.

Everything comes from Debian packages already on the machine (`linux-image-amd64`,
`busybox-static`, and `qemu-guest-agent` with the libraries it links); nothing is
downloaded. The initramfs loads the few kernel modules a QEMU guest needs (virtio disk,
network and serial, the ACPI power button), starts QEMU's guest agent on its virtio-serial
port (what `sandboxes exec`, `put` and `get` talk to), announces boot on the serial console
with `better-compute guest ready`, serves a page on port 80 (so port forwards can be seen
working), powers off on ACPI shutdown and keeps a shell on the console.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import shutil
import subprocess
from pathlib import Path

BOOT_LINE = "better-compute guest ready"
AGENT = Path("/usr/sbin/qemu-ga")
AGENT_PORT = "org.qemu.guest_agent.0"  # the virtio-serial port's name, as QEMU's agent expects
MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "virtio_console", "button", "evdev")

INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /tmp /run /www
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for module in $(cat /lib/modules.order); do insmod "/lib/$module" 2>/dev/null; done
ip link set lo up
ip link set eth0 up 2>/dev/null && ip addr add 10.0.2.15/24 dev eth0 \\
  && ip route add default via 10.0.2.2
hostname "$(sed -n 's/.*bc.sandbox=\\([^ ]*\\).*/\\1/p' /proc/cmdline)"
mkdir -p /run/qga /run/bc-exec /var/run
for port in /sys/class/virtio-ports/*; do
  if [ -x /usr/sbin/qemu-ga ] && [ "$(cat "$port/name" 2>/dev/null)" = {AGENT_PORT} ]; then
    /usr/sbin/qemu-ga -m virtio-serial -p "/dev/${{port##*/}}" -t /run/qga -d
  fi
done
echo "sandbox $(hostname)" > /www/index.html
httpd -p 80 -h /www
mkdir -p /etc/acpi/PWRF
printf '#!/bin/sh\\npoweroff -f\\n' > /etc/acpi/PWRF/00000080
chmod +x /etc/acpi/PWRF/00000080
mkdir -p /var/log /var/run
acpid -c /etc/acpi
echo "{BOOT_LINE}: $(uname -r), $(nproc) vCPUs, $(free -m | awk '/Mem:/{{print $2}}') MiB"
while true; do setsid cttyhack sh; done
"""


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries (directories have no data)."""
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
        out.write(b"070701" + b"".join(b"%08X" % value for value in fields) + encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))
    return out.getvalue()


def _module_closure(modules_dir: Path, wanted: tuple[str, ...]) -> list[str]:
    """Module files (relative to modules_dir) for `wanted`, dependencies first."""
    deps: dict[str, list[str]] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        name, _, needs = line.partition(":")
        deps[name] = needs.split()
    by_name = {Path(path).name.split(".ko")[0].replace("-", "_"): path for path in deps}
    order: list[str] = []

    def visit(path: str) -> None:
        for need in reversed(deps.get(path, [])):
            visit(need)
        if path not in order:
            order.append(path)

    for module in wanted:
        if module in by_name:
            visit(by_name[module])
    return order


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    return data


def find_kernel(boot: Path = Path("/boot")) -> Path:
    kernels = sorted(boot.glob("vmlinuz-*"))
    if not kernels:
        raise FileNotFoundError("no kernel in /boot: install the linux-image-amd64 package")
    return kernels[-1]


def initramfs(init: str, modules: tuple[str, ...], *, release: str,
              files: tuple[tuple[str, int, bytes], ...] = ()) -> bytes:
    """A gzipped initramfs: static busybox, `init`, the kernel `modules` (with what they
    need, in load order, listed in /lib/modules.order) and any other `files`."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise FileNotFoundError("no busybox: install the busybox-static package")
    modules_dir = Path("/lib/modules") / release
    entries: list[tuple[str, int, bytes]] = [
        ("bin", 0o040755, b""), ("lib", 0o040755, b""),
        ("bin/busybox", 0o100755, Path(busybox).read_bytes()),
        ("init", 0o100755, init.encode()), *files]
    order = []
    if (modules_dir / "modules.dep").exists():
        for relative in _module_closure(modules_dir, modules):
            name = Path(relative).name.split(".ko")[0] + ".ko"
            entries.append((f"lib/{name}", 0o100644, _module_bytes(modules_dir / relative)))
            order.append(name)
    entries.append(("lib/modules.order", 0o100644, "\n".join(order).encode() + b"\n"))
    return gzip.compress(_cpio(entries), compresslevel=6, mtime=0)  # 9 costs 4x, saves 0.5%


def agent_files(agent: Path = AGENT) -> tuple[tuple[str, int, bytes], ...]:
    """QEMU's guest agent and the shared libraries it links (as `ldd` names them), for the
    initramfs; none where the host has no `qemu-guest-agent` (the image then boots without
    one, and `sandboxes exec` says so)."""
    if not agent.is_file() or shutil.which("ldd") is None:
        return ()
    listed = subprocess.run(["ldd", str(agent)], capture_output=True, text=True, check=False,
                            timeout=30).stdout
    libraries = {Path(word) for line in listed.splitlines() for word in line.split()
                 if word.startswith("/")}
    folders = {str(path.parent).lstrip("/") for path in libraries}
    entries: list[tuple[str, int, bytes]] = [("usr", 0o040755, b""), ("usr/sbin", 0o040755, b"")]
    for folder in sorted(folders):
        parts = folder.split("/")
        entries += [("/".join(parts[:i]), 0o040755, b"") for i in range(1, len(parts) + 1)
                    if "/".join(parts[:i]) not in ("lib", "usr")]
    entries += [(str(path).lstrip("/"), 0o100755, path.resolve().read_bytes())
                for path in sorted(libraries)]
    entries.append(("usr/sbin/qemu-ga", 0o100755, agent.read_bytes()))
    unique: dict[str, tuple[str, int, bytes]] = {}
    for entry in entries:
        unique.setdefault(entry[0], entry)
    return tuple(unique.values())


def build(out_dir: Path) -> dict[str, Path]:
    """Write `kernel` and `initrd` into out_dir (rebuilt each time: it takes about a
    second) and return their paths."""
    kernel = find_kernel()
    out_dir.mkdir(parents=True, exist_ok=True)
    initrd = out_dir / "initrd.gz"
    initrd.write_bytes(initramfs(INIT, MODULES, release=kernel_release(kernel),
                                 files=agent_files()))
    target = out_dir / "vmlinuz"
    shutil.copyfile(kernel, target)
    return {"kernel": target, "initrd": initrd}


def kernel_release(kernel: Path) -> str:
    return kernel.name.removeprefix("vmlinuz-")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
