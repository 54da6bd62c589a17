"""Sandbox VMs for real: `dev --sim 2 --sim-variant cpu` runs QEMU (TCG here) on its
simulated CPU machines; the sandbox is `running` only once the guest said it booted."""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Stack, free_port, start_stack, stop_stack
from tests.support.waiting import wait_until

BOOT = 90  # seconds a TCG guest may take on a busy machine (it boots in about 12 here)


@pytest.fixture(scope="module")
def cpu_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("vms"), "--sim", "2",
                          "--sim-variant", "cpu",
                          env_extra={"BCD_VM_SHUTDOWN_SECONDS": "10"})
    yield running
    stop_stack(running)


def sandbox(stack: Stack, sandbox_id: str) -> dict[str, Any]:
    return stack.json("sandboxes", "get", sandbox_id)


def vm_folder(stack: Stack, sandbox_id: str) -> Path | None:
    found = list((stack.state_dir / "sim").glob(f"*/var/lib/bcd/vms/{sandbox_id}"))
    return found[0] if found else None


def qemu_processes(sandbox_id: str) -> list[int]:
    """Every QEMU process on this machine that runs this sandbox."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"qemu-system-x86_64") and any(
                sandbox_id.encode() in part for part in cmdline):
            pids.append(int(proc.name))
    return pids


def agent_pid(stack: Stack, node_id: str) -> int:
    """The bcd process of the simulated machine that joined as node_id."""
    for config in (stack.state_dir / "sim").glob("*/etc/bcd/config.toml"):
        if node_id in config.read_text():
            root = str(config.parents[2])
            for proc in Path("/proc").iterdir():
                try:
                    cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"bcd" in cmdline and root.encode() in cmdline and b"node" in cmdline:
                    return int(proc.name)
    raise AssertionError(f"no agent runs for {node_id}")


def allocated(stack: Stack) -> dict[str, tuple[int, int]]:
    nodes = stack.json("nodes", "list", "--pool", stack.env["CPU_POOL"])["items"]
    return {n["id"]: (n["vcpusAllocated"], n["memoryGiBAllocated"]) for n in nodes}


def settled(stack: Stack, sandbox_id: str, states: tuple[str, ...],
            timeout: float = BOOT) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def look() -> bool:
        seen.update(sandbox(stack, sandbox_id))
        return seen["state"] in states

    assert wait_until(look, timeout, interval=0.5), seen
    return seen


def test_a_sandbox_boots_a_real_vm_and_release_leaves_nothing(cpu_stack):
    before = allocated(cpu_stack)
    port = free_port()
    created = cpu_stack.json("sandboxes", "create", "--pool", cpu_stack.env["CPU_POOL"],
                             "--vcpus", "2", "--memory", "1", "--forward", f"{port}:80",
                             "--wait", "--timeout", "60", timeout=90)
    assert (created["state"], created["accelerator"]) == ("running", "tcg"), created
    [pid] = qemu_processes(created["id"])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"-smp") + 1] == b"2" and argv[argv.index(b"-m") + 1] == b"1024"
    folder = vm_folder(cpu_stack, created["id"])
    assert folder is not None and (folder / "disk.qcow2").is_file()
    logs = cpu_stack.ok("sandboxes", "logs", created["id"], "--lines", "200")
    assert "better-compute guest ready" in logs and "2 vCPUs" in logs
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
        assert page.read().decode().strip() == f"sandbox {created['id']}"
    assert allocated(cpu_stack)[created["nodeId"]] == (
        before[created["nodeId"]][0] + 2, before[created["nodeId"]][1] + 1)

    assert cpu_stack.json("sandboxes", "release", created["id"])["state"] == "stopping"
    stopped = settled(cpu_stack, created["id"], ("stopped",), timeout=40)
    assert stopped["endedAt"] is not None
    assert qemu_processes(created["id"]) == []
    assert not folder.exists()  # the overlay disk, console log and sockets are gone
    assert allocated(cpu_stack) == before
    meters = {u["meter"] for u in cpu_stack.json("usage", "list")["items"]
              if u["subject"] == created["id"]}
    assert meters == {"vcpu.hours", "memory.gib-hours"}


def test_agent_killed_while_a_vm_starts_and_while_it_runs_keeps_exactly_one(cpu_stack):
    created = cpu_stack.json("sandboxes", "create", "--pool", cpu_stack.env["CPU_POOL"],
                             "--vcpus", "1", "--memory", "1")
    assert wait_until(lambda: qemu_processes(created["id"]), 30, interval=0.05)
    agent = agent_pid(cpu_stack, created["nodeId"])
    os.kill(agent, signal.SIGKILL)  # QEMU started, the guest is still booting
    first = qemu_processes(created["id"])
    running = settled(cpu_stack, created["id"], ("running", "failed"))
    assert running["state"] == "running", running
    assert qemu_processes(created["id"]) == first  # adopted, not started again

    restarted = agent_pid(cpu_stack, created["nodeId"])
    assert restarted != agent
    os.kill(restarted, signal.SIGKILL)  # now while it runs
    assert wait_until(lambda: agent_pid_or_none(cpu_stack, created["nodeId"])
                      not in (None, restarted), 30)
    cpu_stack.json("sandboxes", "release", created["id"])
    settled(cpu_stack, created["id"], ("stopped",), timeout=40)
    assert qemu_processes(created["id"]) == []


def agent_pid_or_none(stack: Stack, node_id: str) -> int | None:
    try:
        return agent_pid(stack, node_id)
    except AssertionError:
        return None


def test_qemu_killed_fails_the_sandbox_frees_it_and_says_why(cpu_stack):
    before = allocated(cpu_stack)
    created = cpu_stack.json("sandboxes", "create", "--pool", cpu_stack.env["CPU_POOL"],
                             "--vcpus", "2", "--memory", "1", "--wait", timeout=BOOT)
    assert created["state"] == "running"
    [pid] = qemu_processes(created["id"])
    os.kill(pid, signal.SIGKILL)
    failed = settled(cpu_stack, created["id"], ("failed",), timeout=30)
    assert failed["exitStatus"] == 137 and "exited on its own" in failed["failureReason"]
    assert allocated(cpu_stack) == before
    events = cpu_stack.json("events", "list", "--subject", created["id"])["items"]
    assert "sandbox.failed" in [e["type"] for e in events]
    rows = cpu_stack.json("audit", "list", "--target", created["id"])["items"]
    failure = [r for r in rows if r["action"] == "sandbox.fail"]
    assert len(failure) == 1 and "137" in failure[0]["reason"]
    assert failure[0]["actorId"] == created["nodeId"]  # said by the node, signed


def test_bad_images_and_requests_that_do_not_fit_leave_nothing_claimed(cpu_stack):
    pool = cpu_stack.env["CPU_POOL"]
    before = allocated(cpu_stack)
    default = cpu_stack.json("images", "list", "--pool", pool)["items"][0]
    kernel, initrd = default["kernel"], default["initrd"]
    cases = {
        "wrong-hash": (kernel["url"], "0" * 64, "has sha256"),
        # (a part is cached by its hash: a missing kernel has one no node has seen)
        "no-kernel": (kernel["url"].rsplit("/", 1)[0] + "/missing", "1" * 64,
                      "could not be fetched"),
    }
    for name, (url, digest, said) in cases.items():
        cpu_stack.json("images", "create", "--pool", pool, "--name", name, "--kernel", url,
                       "--kernel-sha256", digest, "--initrd", initrd["url"],
                       "--initrd-sha256", initrd["sha256"])
        result = cpu_stack.cli("sandboxes", "create", "--pool", pool, "--vcpus", "1",
                               "--memory", "1", "--image", name, "--wait", "--timeout", "30",
                               timeout=60)
        assert result.returncode != 0 and "failed" in result.stderr, result
        assert said in result.stderr, result.stderr
    too_big = cpu_stack.cli("sandboxes", "create", "--pool", pool, "--vcpus", "64",
                            "--memory", "1")
    assert too_big.returncode != 0 and "capacity_conflict" in too_big.stderr + too_big.stdout
    assert allocated(cpu_stack) == before
