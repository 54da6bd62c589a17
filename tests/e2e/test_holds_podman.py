"""A hold used by a real container runtime: Podman runs the README's command on a simulated
node whose GPU device files are real character devices (NVIDIA's major number, made under
the node's root), and the container gets exactly the held GPUs and the hold's variables.

Debian's Podman reads CDI specs from /etc/cdi only, so the command runs in a private mount
namespace where the node's /etc/cdi is mounted there; the image is busybox imported from a
tarball (no registry is reachable)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.test_tutorial_cli import node_root
from tests.support.gpu_files import CONTROL_MINOR, NVIDIA_MAJOR, make_gpu_files
from tests.support.waiting import wait_until

README = Path(__file__).resolve().parents[2] / "README.md"
ENV_PLACEHOLDER = "/run/bcd/allocations/alloc_….env"
LISTING = re.compile(r"^c\S+\s+\d+\s+\d+\s+\d+\s+(\d+),\s+(\d+)\s.*\s(nvidia\S*)$", re.M)
# Here runc, not crun (the machine's cgroup layout), and rlimits the machine allows.
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:20000", "nproc=4096:4096"]
netns = "none"
[engine]
runtime = "runc"
"""


def readme_podman_block() -> str:
    blocks = re.findall(r"```sh\n(# Podman.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Podman block"
    assert ENV_PLACEHOLDER in blocks[0]
    assert "IMAGE nvidia-smi -L" in blocks[0]
    return blocks[0]


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A busybox image imported into Podman, and the environment its commands run with."""
    missing = [tool for tool in ("podman", "runc", "busybox", "unshare")
               if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: install podman, runc and busybox-static")
    if os.geteuid() != 0:
        pytest.skip("device files and a private mount namespace need root")
    folder = tmp_path_factory.mktemp("podman")
    rootfs = folder / "rootfs" / "bin"
    rootfs.mkdir(parents=True)
    shutil.copy(shutil.which("busybox") or "", rootfs / "busybox")
    for applet in ("sh", "ls", "env", "cat", "true"):
        (rootfs / applet).symlink_to("busybox")
    subprocess.run(["tar", "-C", str(folder / "rootfs"), "-cf", str(folder / "fs.tar"), "."],
                   check=True)
    (folder / "containers.conf").write_text(CONTAINERS_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(folder / "containers.conf")}
    image = f"localhost/bcd-test-busybox:{folder.name}"
    subprocess.run(["podman", "import", "-q", str(folder / "fs.tar"), image], env=env,
                   check=True, capture_output=True, timeout=120)
    yield image, env
    subprocess.run(["podman", "rmi", "-f", image], env=env, capture_output=True, check=False,
                   timeout=120)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("podman-dev"), "--sim", "1")
    yield running
    stop_stack(running)


def in_node_cdi(root: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `script` where /etc/cdi is the node's own (Podman reads no other directory)."""
    Path("/etc/cdi").mkdir(exist_ok=True)
    wrapped = f'mount --bind "{root}/etc/cdi" /etc/cdi\n{script}'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec",
                           wrapped], env=env, capture_output=True, text=True, timeout=180,
                          check=False)


def devices_seen(listing: str) -> dict[str, int]:
    """`ls -ln /dev` in the container: each NVIDIA device file's name and minor number."""
    return {name: int(minor) for major, minor, name in LISTING.findall(listing)
            if int(major) == NVIDIA_MAJOR}


def assert_exactly_held(listing: str, held_minors: set[int]) -> None:
    seen = devices_seen(listing)
    assert seen.pop("nvidiactl", None) == CONTROL_MINOR, listing
    assert set(seen.values()) == held_minors, (seen, held_minors)
    assert {f"nvidia{minor}" for minor in held_minors} == set(seen), seen


def toolkit_unavailable_yet_bookable(stack: Stack, node_id: str, root: Path,
                                     folder: Path) -> None:
    """The pool's profile names container-toolkit; this machine has no nvidia-ctk: the
    unit says so (API and `bcd status`), and the node is booked all the same."""
    stack.add_to_policy(folder, profile={"units": ["container-toolkit"]})

    def toolkit() -> dict:
        return stack.profile_unit(node_id, "container-toolkit")

    assert wait_until(lambda: toolkit().get("state") == "unavailable", timeout=30), toolkit()
    assert "nvidia-ctk not found" in toolkit()["reason"]
    assert toolkit()["generation"] >= 2
    status = subprocess.run([sys.executable, "-m", "bcd", "--root", str(root), "status"],
                            capture_output=True, text=True, timeout=30, check=False).stdout
    assert "unit        container-toolkit unavailable (generation" in status, status
    assert "nvidia-ctk not found" in status


def test_podman_runs_the_readme_command_on_exactly_the_held_gpus(stack, podman, tmp_path):
    image, env = podman
    node = stack.json("nodes", "list")["items"][0]
    root = node_root(stack, node["id"])
    devices = stack.json("nodes", "get", node["id"])["devices"]
    gpus = {d["uuid"]: d["index"] for d in devices if d["class"] == "gpu"}
    make_gpu_files(root, len(gpus))
    toolkit_unavailable_yet_bookable(stack, node["id"], root, tmp_path)
    rsv = stack.json("reserve", "--pool", stack.env["POOL"], "--gpus", "2", "--for", "1h")
    assert rsv["state"] == "active", rsv["failureReason"]
    binding = rsv["binding"]
    held = [device.split("=", 1)[1] for device in binding["cdiDevices"]]
    held_minors = {gpus[uuid] for uuid in held}
    assert len(held_minors) == 2

    inside = "sh -c 'ls -ln /dev; echo ---; env'"
    script = readme_podman_block().replace(ENV_PLACEHOLDER, binding["envFile"])
    script = script.replace("IMAGE nvidia-smi -L", f"{image} {inside}")
    ran = in_node_cdi(root, script, env)
    assert ran.returncode == 0, ran.stderr
    listing, variables = ran.stdout.split("---\n", 1)
    assert_exactly_held(listing, held_minors)
    assert f"BCD_RESERVATION_ID={rsv['id']}" in variables.splitlines()
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(held)}" in variables.splitlines()
    assert f"BCD_ALLOCATION_ID={rsv['allocationId']}" in variables.splitlines()

    # The check fails on a wrong hold: a spec whose first device is another GPU's file.
    spec_file = root / "etc" / "cdi" / f"bcd-{rsv['allocationId']}.json"
    good = spec_file.read_text()
    spec = json.loads(good)
    other = min(set(gpus.values()) - held_minors)
    spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = \
        str(root / "dev" / f"nvidia{other}")
    spec_file.write_text(json.dumps(spec))
    wrong = in_node_cdi(root, script, env)
    assert wrong.returncode == 0, wrong.stderr
    with pytest.raises(AssertionError):
        assert_exactly_held(wrong.stdout.split("---\n", 1)[0], held_minors)
    spec_file.write_text(good)

    # Released, the same devices are unknown to Podman.
    assert stack.ok("release", rsv["id"], "--query", "state") == "released"
    assert wait_until(lambda: not spec_file.exists(), timeout=30)  # (the agent applies it)
    after = in_node_cdi(root, f"podman run --rm --device {binding['cdiDevices'][0]} {image} "
                              "true", env)
    assert after.returncode != 0
    assert "unresolvable CDI devices" in after.stderr, after.stderr
