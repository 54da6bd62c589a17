"""A small OS image for a deploy to write: a FAT disk that boots (syslinux) a distribution
kernel and an initramfs holding busybox and bcd as a single executable with the C library
it needs. Its init joins with the `better-compute/join.json` the deploy ramdisk wrote into
the disk, then runs `bcd node`: the machine is a real VM, its GPUs none."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from compute.cli.deployimage import DHCP_SCRIPT, NETWORK
from compute.cli.guestimage import find_kernel, initramfs, kernel_release

BOOTED = "better-compute os: booted from its disk"
MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "vfat", "nls_cp437", "nls_iso8859_1",
           "nls_utf8", "nls_ascii", "button")
LIBRARIES = ("libc.so.6", "libm.so.6", "libz.so.1", "libpthread.so.0", "libdl.so.2",
             "librt.so.1", "libutil.so.1", "libgcc_s.so.1", "libstdc++.so.6", "libcrypt.so.1",
             "libffi.so.8", "libexpat.so.1", "liblzma.so.5", "libbz2.so.1.0", "libuuid.so.1")
LIB = Path("/lib/x86_64-linux-gnu")
LOADER = Path("/lib64/ld-linux-x86-64.so.2")

OS_INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
umask 077
mkdir -p /proc /sys /dev /tmp /disk /var/bcd
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmpfs /tmp
for module in $(cat /lib/modules.order); do insmod "/lib/$module" 2>/dev/null; done
echo "{BOOTED}"
{NETWORK}
# The lab: the control plane listens on the host's loopback, which QEMU's user network
# reaches as 10.0.2.2; route this machine's 127/8 there.
ip route del local 127.0.0.0/8 dev lo table local
ip addr del 127.0.0.1/8 dev lo
for knob in /proc/sys/net/ipv4/conf/*/route_localnet; do echo 1 > "$knob"; done
ip route add 127.0.0.0/8 via 10.0.2.2
mount -t vfat -o ro /dev/vda /disk || echo "better-compute os: no disk"
field() {{ sed -n "s/.*\\"$1\\": \\"\\([^\\"]*\\)\\".*/\\1/p" /disk/better-compute/join.json; }}
field token > /tmp/token
/bin/bcd --root /var/bcd join --server "$(field server)" \\
  --serving-ca-pin "$(field servingCaPin)" --join-signing-pin "$(field joinSigningPin)" \\
  --join-encryption-pin "$(field joinEncryptionPin)" --token-file /tmp/token \\
  --hostname "$(hostname)" && exec /bin/bcd --root /var/bcd node
echo "better-compute os: the join failed"
while true; do sleep 3600; done
"""


def build_os_image(out_dir: Path, bcd_executable: Path) -> Path:
    """`os.raw`: the FAT disk (no partition table) that boots into bcd."""
    kernel = find_kernel()
    libraries = [(f"lib/x86_64-linux-gnu/{name}", 0o100755, (LIB / name).read_bytes())
                 for name in LIBRARIES if (LIB / name).exists()]
    files = (("etc", 0o040755, b""), ("etc/dhcp.script", 0o100755, DHCP_SCRIPT.encode()),
             ("etc/hostname", 0o100644, b"metal-vm\n"),
             ("lib/x86_64-linux-gnu", 0o040755, b""), ("lib64", 0o040755, b""),
             ("lib64/ld-linux-x86-64.so.2", 0o100755, LOADER.read_bytes()), *libraries,
             ("bin/bcd", 0o100755, bcd_executable.read_bytes()))
    out_dir.mkdir(parents=True, exist_ok=True)
    initrd = out_dir / "os-initrd.gz"
    initrd.write_bytes(initramfs(OS_INIT, MODULES, release=kernel_release(kernel),
                                 files=files))
    (out_dir / "syslinux.cfg").write_text(
        "DEFAULT os\nPROMPT 0\nTIMEOUT 1\nLABEL os\n  KERNEL vmlinuz\n"
        "  APPEND initrd=initrd.gz console=ttyS0 hostname=metal-vm\n")
    shutil.copyfile(kernel, out_dir / "vmlinuz")
    image = out_dir / "os.raw"
    image.unlink(missing_ok=True)
    size_kib = (initrd.stat().st_size + kernel.stat().st_size) // 1024 + 16 * 1024
    subprocess.run(["mkfs.fat", "-C", "-n", "BCOS", str(image), str(size_kib)], check=True,
                   capture_output=True)
    subprocess.run(["syslinux", "--install", str(image)], check=True, capture_output=True)
    subprocess.run(["mcopy", "-i", str(image), str(out_dir / "vmlinuz"),
                    str(out_dir / "syslinux.cfg"), "::/"], check=True, capture_output=True)
    subprocess.run(["mcopy", "-i", str(image), str(initrd), "::/initrd.gz"], check=True,
                   capture_output=True)
    return image
