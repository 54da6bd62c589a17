"""The deploy ramdisk: what a machine boots from virtual media (or PXE) to have an OS image
written to its disk by `nodes deploy`.

Built from Debian packages already on the machine (`linux-image-amd64`, `busybox-static`,
and `isolinux` with `xorriso` for the ISO); nothing is downloaded. Its init brings the
network up (DHCP), asks the site's provisioner for this machine's instructions (by its DMI
serial and product UUID, at the `bc.deploy=URL` of its kernel command line), streams the
image onto the first disk checking its sha256, writes the agent's join file into the
image's first FAT filesystem (`better-compute/join.json`: the OS reads it at first boot
and joins), tells the provisioner, and powers off; the provisioner boots the disk.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from compute.cli.guestimage import find_kernel, initramfs, kernel_release

SAY = "better-compute deploy"
MODULES = ("virtio_pci", "virtio_blk", "virtio_net", "virtio_scsi", "sd_mod", "ahci", "nvme",
           "e1000", "e1000e", "vfat", "nls_cp437", "nls_iso8859_1", "nls_utf8", "nls_ascii",
           "button")
ISOLINUX = Path("/usr/lib/ISOLINUX/isolinux.bin")
LDLINUX = Path("/usr/lib/syslinux/modules/bios/ldlinux.c32")
HYBRID_MBR = Path("/usr/lib/ISOLINUX/isohdpfx.bin")

# DHCP as busybox's udhcpc hands it to its script: address, prefix, default route.
DHCP_SCRIPT = """#!/bin/sh
[ "$1" = bound ] || [ "$1" = renew ] || exit 0
ip addr flush dev "$interface"
ip addr add "$ip/${mask:-24}" dev "$interface"
for r in $router; do ip route add default via "$r" dev "$interface"; break; done
"""

# The network, as both the ramdisk and a small OS bring it up: every NIC until one leases.
NETWORK = """ip link set lo up
for nic in $(ls /sys/class/net); do
  [ "$nic" = lo ] && continue
  ip link set "$nic" up && udhcpc -i "$nic" -n -q -t 10 -T 2 -s /etc/dhcp.script \
    >/dev/null 2>&1 && break
done
"""

DEPLOY_INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /tmp /mnt
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for module in $(cat /lib/modules.order); do insmod "/lib/$module" 2>/dev/null; done
say() {{ echo "{SAY}: $*"; }}
fail() {{ say "FAILED: $*"; while true; do sleep 3600; done; }}
{NETWORK}
url=$(sed -n 's/.*bc.deploy=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
serial=$(cat /sys/class/dmi/id/product_serial 2>/dev/null)
uuid=$(cat /sys/class/dmi/id/product_uuid 2>/dev/null)
[ -n "$url" ] || fail "no bc.deploy=URL on the kernel command line"
say "machine $uuid asks $url for its instructions"
until wget -q -O /tmp/deploy.json "$url?serial=$serial&productUuid=$uuid"; do
  say "no instructions yet"; sleep 5
done
field() {{ sed -n "s/.*\\"$1\\": \\"\\([^\\"]*\\)\\".*/\\1/p" /tmp/deploy.json; }}
image=$(field url); sha=$(field sha256); target=$(field target); key=$(field deployKey)
disk=""
for name in vda sda nvme0n1 xvda; do [ -b "/dev/$name" ] && disk=/dev/$name && break; done
[ -n "$disk" ] || fail "no disk to write"
say "writing $image to $disk"
got=$(wget -q -O - "$image" | tee "$disk" | sha256sum | cut -d' ' -f1)
sync
[ "$got" = "$sha" ] || fail "the image's sha256 is $got, not $sha"
say "written: sha256 $got matches"
blockdev --rereadpt "$disk" 2>/dev/null; sleep 1
join=$(sed -n 's/.*"join": \\({{[^}}]*}}\\).*/\\1/p' /tmp/deploy.json)
placed=""
for part in $(ls "$disk"*); do
  if mount -t vfat "$part" /mnt 2>/dev/null; then
    mkdir -p /mnt/better-compute && echo "$join" > /mnt/better-compute/join.json
    umount /mnt && placed=$part && break
  fi
done
[ -n "$placed" ] || fail "the image has no FAT filesystem for better-compute/join.json"
sync
say "join file written to $placed"
wget -q -O /dev/null --post-data "" "$url/written?target=$target&key=$key" \\
  || fail "the provisioner did not take the news"
say "powering off: the provisioner boots the disk"
poweroff -f
"""


def deploy_initrd(*, release: str) -> bytes:
    return initramfs(DEPLOY_INIT, MODULES, release=release,
                     files=(("etc", 0o040755, b""),
                            ("etc/dhcp.script", 0o100755, DHCP_SCRIPT.encode())))


def build_deploy_ramdisk(out_dir: Path, deploy_url: str) -> dict[str, Path]:
    """Write `vmlinuz`, `initrd.gz` (for PXE) and `deploy.iso` (virtual media, booting the
    same with `bc.deploy=deploy_url`) into out_dir; returns their paths."""
    for needed, package in ((ISOLINUX, "isolinux"), (LDLINUX, "syslinux-common")):
        if not needed.exists():
            raise FileNotFoundError(f"no {needed}: install the {package} package")
    xorriso = shutil.which("xorriso")
    if xorriso is None:
        raise FileNotFoundError("no xorriso: install the xorriso package")
    kernel = find_kernel()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"kernel": out_dir / "vmlinuz", "initrd": out_dir / "initrd.gz",
             "iso": out_dir / "deploy.iso"}
    shutil.copyfile(kernel, paths["kernel"])
    paths["initrd"].write_bytes(deploy_initrd(release=kernel_release(kernel)))
    with tempfile.TemporaryDirectory() as staging:
        root = Path(staging)
        (root / "isolinux").mkdir()
        shutil.copyfile(ISOLINUX, root / "isolinux/isolinux.bin")
        shutil.copyfile(LDLINUX, root / "isolinux/ldlinux.c32")
        (root / "isolinux/isolinux.cfg").write_text(
            "DEFAULT deploy\nPROMPT 0\nTIMEOUT 1\nLABEL deploy\n  KERNEL /vmlinuz\n"
            f"  APPEND initrd=/initrd.gz console=tty0 console=ttyS0 bc.deploy={deploy_url}\n")
        shutil.copyfile(paths["kernel"], root / "vmlinuz")
        shutil.copyfile(paths["initrd"], root / "initrd.gz")
        subprocess.run(
            [xorriso, "-as", "mkisofs", "-quiet", "-o", str(paths["iso"]), "-V", "BC_DEPLOY",
             "-b", "isolinux/isolinux.bin", "-c", "isolinux/boot.cat", "-no-emul-boot",
             "-boot-load-size", "4", "-boot-info-table",
             *(["-isohybrid-mbr", str(HYBRID_MBR)] if HYBRID_MBR.exists() else []),
             str(root)], check=True, capture_output=True)
    return paths
