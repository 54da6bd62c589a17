"""Deploy, end to end, on one real machine: a QEMU VM (TCG) that sushy-tools' emulator
drives through Debian's libvirt daemon, as a BMC drives a server.

`nodes deploy` makes `dev`'s provisioner insert the deploy ramdisk's ISO in the VM's
virtual CD, boot it and power on; the ramdisk (built by `images deploy-ramdisk`) takes its
instructions from the provisioner, writes the OS image to the VM's disk checking its
sha256, writes the join file, says so and powers off; the provisioner boots the disk. The
OS's bcd (the single-file executable) joins through the real gateway with the token bound
to the VM's UUID, and the node turns adopted. Skipped, with the reason, where libvirt's
daemon cannot run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from bcd.contract.version import version
from compute.cli.artifact import executable_name
from compute.cli.deployimage import SAY, build_deploy_ramdisk
from tests.e2e.conftest import start_stack, stop_stack
from tests.support.metalos import BOOTED, build_os_image
from tests.support.redfish import USERNAME, Emulator, served
from tests.support.waiting import wait_until

PASSWORD = f"vm-bmc-{uuid.uuid4().hex[:10]}"
URI = "qemu:///system"
SLIRP_HOST = "10.0.2.2"  # the host's loopback, as QEMU's user network shows it to a guest
TOOLS = ("libvirtd", "virsh", "qemu-system-x86_64", "xorriso", "mkfs.fat", "syslinux",
         "mcopy")


def _libvirt_or_skip() -> list[subprocess.Popen[bytes]]:
    """A running libvirt daemon (started here if none runs); skips, saying why, if it
    cannot run on this machine."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: install libvirt-daemon-system, qemu-system-x86, "
                    "xorriso, isolinux, syslinux, mtools and dosfstools")
    try:
        import libvirt  # noqa: F401
    except ImportError:
        pytest.skip("no libvirt-python (the test extras build it against libvirt-dev)")
    started = []  # without systemd's socket activation: the daemons, started here
    for daemon in ("virtlogd", "libvirtd"):
        if subprocess.run(["pgrep", "-x", daemon], capture_output=True).returncode != 0:
            started.append(subprocess.Popen([daemon], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
    if not wait_until(lambda: virsh("version").returncode == 0, 30):
        answer = virsh("version")
        for process in started:
            process.terminate()
        pytest.skip(f"libvirt's daemon cannot run here: {answer.stderr.strip()[:300]}")
    return started


def virsh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """virsh against the system daemon; a daemon that does not answer in `timeout` seconds
    reads as a failed command, not a hung test."""
    try:
        return subprocess.run(["virsh", "-c", URI, *args], capture_output=True, text=True,
                              check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"virsh {args[0]}: no answer")


@pytest.fixture(scope="module")
def shared():
    """A folder QEMU's own user (libvirt-qemu) can reach: pytest's is root's alone."""
    root = Path(tempfile.mkdtemp(prefix="bc-metal-", dir="/var/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def libvirtd(shared):
    """libvirt's daemon, with the storage pool `default` the emulator puts media in."""
    started = _libvirt_or_skip()
    made_pool = virsh("pool-info", "default").returncode != 0
    if made_pool:
        images = shared / "images"
        images.mkdir(mode=0o755)
        for step in (("pool-define-as", "default", "dir", "--target", str(images)),
                     ("pool-start", "default")):
            assert virsh(*step).returncode == 0, virsh(*step).stderr
    yield
    if made_pool:
        virsh("pool-destroy", "default")
        virsh("pool-undefine", "default")
    for process in started:
        process.terminate()
        process.wait(timeout=30)


def domain_xml(name: str, machine_uuid: str, disk: Path, console: Path) -> str:
    return f"""<domain type='qemu'>
  <name>{name}</name><uuid>{machine_uuid}</uuid>
  <memory unit='MiB'>1024</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff><on_reboot>restart</on_reboot>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='raw'/>
      <source file='{disk}'/><target dev='vda' bus='virtio'/></disk>
    <disk type='file' device='cdrom'><driver name='qemu' type='raw'/>
      <target dev='hdc' bus='ide'/><readonly/></disk>
    <interface type='user'><model type='virtio'/></interface>
    <serial type='file'><source path='{console}' append='on'/><target port='0'/></serial>
  </devices>
</domain>"""


@pytest.fixture(scope="module")
def vm(libvirtd, shared):
    """A powered-off VM with an empty disk and an empty virtual CD."""
    root = shared / "vm"
    root.mkdir(mode=0o755)
    machine_uuid = str(uuid.uuid4())
    name = f"bc-metal-{machine_uuid[:8]}"
    disk, console = root / "disk.raw", root / "console.log"
    subprocess.run(["qemu-img", "create", "-f", "raw", str(disk), "256M"], check=True,
                   capture_output=True)
    (root / "domain.xml").write_text(domain_xml(name, machine_uuid, disk, console))
    defined = virsh("define", str(root / "domain.xml"))
    assert defined.returncode == 0, defined.stderr
    yield {"uuid": machine_uuid, "name": name, "disk": disk, "console": console}
    if virsh("destroy", name, timeout=30).returncode == 124:
        subprocess.run(["pkill", "-KILL", "-f", f"guest={name}"], check=False)
    virsh("undefine", name, timeout=30)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, libvirtd):
    running = start_stack(tmp_path_factory.mktemp("metal-vm"), "--sim", "0")
    yield running
    stop_stack(running)


@pytest.mark.campaign
@pytest.mark.timeout(900)  # two TCG boots on a loaded 2-core machine: 110 to 180 s
def test_a_deployed_vm_boots_its_written_disk_and_its_agent_joins_as_the_node(
        stack, vm, agent_artifacts, tmp_path):
    media = tmp_path / "media"
    bcd = agent_artifacts.folder / executable_name(version())
    image = build_os_image(media, bcd)
    deploy_url = stack.env["DEPLOY_URL"].replace("127.0.0.1", SLIRP_HOST)
    build_deploy_ramdisk(media, deploy_url)
    pool = stack.json("pools", "create", "--site", stack.env["SITE"], "--class", "cpu-host",
                      "--name", "metal-vms")["id"]
    bmc = Emulator(tmp_path / "bmc", PASSWORD, [{"uuid": vm["uuid"]}], libvirt=URI).start()
    try:
        with served(media) as url:
            port = url.rpartition(":")[2]
            for name, source, part in (("deploy", url, "deploy.iso"),
                                       ("os", f"http://{SLIRP_HOST}:{port}", image.name)):
                digest = hashlib.sha256((media / part).read_bytes()).hexdigest()
                stack.ok("images", "create", "--pool", pool, "--name", name, *[
                    arg for what in ("kernel", "initrd", "disk")
                    for arg in (f"--{what}", f"{source}/{part}", f"--{what}-sha256", digest)])
            credentials = tmp_path / "bmc.json"
            credentials.write_text(json.dumps({"username": USERNAME, "password": PASSWORD}))
            credentials.chmod(0o600)
            enrolled = stack.cli("nodes", "enroll", "--pool", pool, "--bmc", bmc.bmc(vm["uuid"]),
                                 "--bmc-credentials-file", str(credentials), "--hostname",
                                 "metal-vm", "--wait", "--output", "json", timeout=180)
            assert enrolled.returncode == 0, enrolled.stderr
            machine = json.loads(enrolled.stdout)
            assert machine["productUuid"] == vm["uuid"]
            started = time.monotonic()
            deployed = stack.cli("nodes", "deploy", machine["id"], "--image", "os", "--ramdisk",
                                 "deploy", "--timeout", "15m", "--wait", "--output", "json",
                                 timeout=1000)
            took = time.monotonic() - started
        console = (vm["console"].read_text(errors="replace") if vm["console"].exists()
                   else "(the VM never started)")
        assert deployed.returncode == 0, (deployed.stderr, console[-3000:])
        node = json.loads(deployed.stdout)
        assert (node["id"], node["provisionState"], node["schedulable"]) == (
            machine["id"], "adopted", True)
        assert f"{SAY}: written: sha256 {hashlib.sha256(image.read_bytes()).hexdigest()}" \
            in console
        assert BOOTED in console  # the second boot came from the disk the ramdisk wrote
        with vm["disk"].open("rb") as disk:
            assert disk.read(512)[510:] == b"\x55\xaa"  # syslinux's boot sector, written
        print(f"deploy to adopted took {took:.0f} s")  # noqa: T201
    finally:
        bmc.stop()
