"""Sandbox VMs for real: `dev --sim 2 --sim-variant cpu` runs QEMU (TCG here) on its
simulated CPU machines; the sandbox is `running` only once the guest said it booted."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Stack, free_port, start_stack, stop_stack
from tests.support.waiting import wait_until
from tests.test_mcp import over_stdio

BOOT = 90  # seconds a TCG guest may take on a busy machine (it boots in about 12 here)


@pytest.fixture(scope="module")
def cpu_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("vms"), "--sim", "2",
                          "--sim-variant", "cpu", "--sim-processes",  # (agents are killed)
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
                # `bcd node`, or `bcd join --run` (dev's machines join and run in one go)
                agent = b"node" in cmdline or (b"join" in cmdline and b"--run" in cmdline)
                if b"bcd" in cmdline and root.encode() in cmdline and agent:
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
                             "--wait", "--wait-timeout", "60", timeout=90)
    assert (created["state"], created["accelerator"]) == ("running", "tcg"), created
    [pid] = qemu_processes(created["id"])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"-smp") + 1] == b"2"
    assert argv[argv.index(b"-m") + 1] == b"1024"
    folder = vm_folder(cpu_stack, created["id"])
    assert folder is not None
    assert (folder / "disk.qcow2").is_file()
    logs = cpu_stack.ok("sandboxes", "logs", created["id"], "--lines", "200")
    assert "better-compute guest ready" in logs
    assert "2 vCPUs" in logs
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
    meters = {u["meter"] for u in cpu_stack.json("usage", "list", "--subject",
                                                 created["id"])["items"]}
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
    assert failed["exitStatus"] == 137
    assert "exited on its own" in failed["failureReason"]
    assert allocated(cpu_stack) == before
    events = cpu_stack.json("events", "list", "--subject", created["id"])["items"]
    assert "sandbox.failed" in [e["type"] for e in events]
    rows = cpu_stack.json("audit", "list", "--target", created["id"])["items"]
    failure = [r for r in rows if r["action"] == "sandbox.fail"]
    assert len(failure) == 1
    assert "137" in failure[0]["reason"]
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
                               "--memory", "1", "--image", name, "--wait", "--wait-timeout", "30",
                               timeout=60)
        assert result.returncode != 0, result
        assert "failed" in result.stderr, result
        assert said in result.stderr, result.stderr
    too_big = cpu_stack.cli("sandboxes", "create", "--pool", pool, "--vcpus", "64",
                            "--memory", "1")
    assert too_big.returncode != 0
    assert "capacity_conflict" in too_big.stderr + too_big.stdout
    assert allocated(cpu_stack) == before


@pytest.fixture
def small_gpu_node(cpu_stack, tmp_path) -> Iterator[tuple[str, str]]:
    """A GPU pool whose one simulated machine has 16 vCPUs and 16 GiB for 8 GPUs (2 and 2
    per GPU), with the dev image: GPU host shares and VMs compete for the same counters."""
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"hostShare": {"vcpusPerGpu": 2, "memoryGiBPerGpu": 2}}))
    pool = cpu_stack.json("pools", "create", "--site", cpu_stack.env["SITE"], "--class",
                          "metal-host", "--gpu-model", "H100", "--policy-file", str(policy))
    guest = sorted((cpu_stack.state_dir / "downloads").glob("guest-*"))
    cpu_stack.json("images", "create", "--pool", pool["id"], "--name", "default",
                   "--kernel", str(guest[-1]), "--initrd", str(guest[0]))
    pins = cpu_stack.json("pki", "show")
    token = cpu_stack.json("join-tokens", "create", "--pool", pool["id"], "--ttl", "1h")
    root = tmp_path / "machine"
    env = {**cpu_stack.env, "BCD_JOIN_TOKEN": token["token"], "BCD_SIM_VCPUS": "16",
           "BCD_SIM_MEMORY_GIB": "16", "BCD_VM_SHUTDOWN_SECONDS": "5"}
    joined = subprocess.run(
        [sys.executable, "-m", "bcd", "--root", str(root), "join", "--server",
         cpu_stack.env["BETTER_COMPUTE_URL"], "--sim", "--hostname", "gpu-small",
         "--serving-ca-pin", pins["servingCaSpkiPin"],
         "--join-signing-pin", pins["joinSigningKeyPin"],
         "--join-encryption-pin", pins["joinEncryptionKeyPin"]],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert joined.returncode == 0, joined.stderr
    agent = subprocess.Popen([sys.executable, "-m", "bcd", "--root", str(root), "node"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: [n for n in cpu_stack.json("nodes", "list", "--pool",
                                                              pool["id"])["items"]
                                   if n["provisionState"] == "adopted"], 60, interval=0.5)
        yield pool["id"], root
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        for pidfile in root.glob("var/lib/bcd/vms/*/qemu.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


DRIFT = """
SELECT n.vcpus_allocated, n.memory_gib_allocated, n.vcpus, n.memory_gib,
  (SELECT coalesce(sum(vcpus), 0) FROM reservations_allocation a
    WHERE a.node_id = n.id AND a.ended_at IS NULL)
  + (SELECT coalesce(sum(vcpus), 0) FROM reservations_sandbox s
    WHERE s.node_id = n.id AND s.ended_at IS NULL),
  (SELECT coalesce(sum(memory_gib), 0) FROM reservations_allocation a
    WHERE a.node_id = n.id AND a.ended_at IS NULL)
  + (SELECT coalesce(sum(memory_gib), 0) FROM reservations_sandbox s
    WHERE s.node_id = n.id AND s.ended_at IS NULL)
FROM fleet_node n WHERE n.pool_id = %s"""


def test_gpu_bookings_and_real_vms_racing_never_exceed_the_host_counters(cpu_stack,
                                                                        small_gpu_node):
    import psycopg

    from compute.client import ApiError, Client

    pool, root = small_gpu_node
    client = Client(cpu_stack.env["BETTER_COMPUTE_URL"], cpu_stack.env["BETTER_COMPUTE_TOKEN"])
    stop, samples, problems = threading.Event(), [], []
    made: dict[str, list[str]] = {"rsv": [], "sbx": []}

    def gpus(rng: random.Random) -> None:
        while not stop.is_set():
            try:
                rsv = client.reservations.create(
                    pool_id=pool, duration=3_600_000, idempotency_key=uuid.uuid4().hex,
                    devices=[{"class": "gpu", "count": rng.choice([1, 2, 4])}])
                made["rsv"].append(rsv["id"])
                time.sleep(rng.uniform(0, 1.5))
                client.reservations.release(reservation_id=rsv["id"])
            except ApiError as error:
                if error.code not in ("capacity_conflict", "invalid_state"):
                    problems.append(f"{error.code}: {error}")

    def vms(rng: random.Random) -> None:
        boots = True  # the first guest of each thread boots; a third of the others
        while not stop.is_set():
            try:
                box = client.sandboxes.create(pool_id=pool, vcpus=2, memory_gi_b=2,
                                              idempotency_key=uuid.uuid4().hex)
                made["sbx"].append(box["id"])
                if boots:
                    wait_until(lambda box=box: client.sandboxes.get(
                        sandbox_id=box["id"])["state"] in ("running", "failed"), 120,
                        interval=0.5)
                else:  # released while QEMU starts, or before
                    time.sleep(rng.choice([0.5, 2]))
                client.sandboxes.release(sandbox_id=box["id"])
                boots = rng.random() < 0.3
            except ApiError as error:
                if error.code not in ("capacity_conflict", "invalid_state"):
                    problems.append(f"{error.code}: {error}")
            time.sleep(0.2)

    def sample() -> None:
        with psycopg.connect(cpu_stack.env["DATABASE_URL"], autocommit=True) as db:
            while not stop.is_set():
                samples.extend(db.execute(DRIFT, [pool]).fetchall())
                time.sleep(0.1)

    threads = [threading.Thread(target=gpus, args=(random.Random(seed),)) for seed in (1, 2)]
    threads += [threading.Thread(target=vms, args=(random.Random(seed),)) for seed in (3, 4)]
    threads.append(threading.Thread(target=sample))
    for thread in threads:
        thread.start()
    # Several boots, and many releases racing a start, per VM thread: at least 25 s, and
    # on a loaded machine (a guest boot under TCG can take most of that) until each kind
    # of client has made four.
    started = time.monotonic()
    wait_until(lambda: time.monotonic() - started >= 25 and len(made["sbx"]) >= 4
               and len(made["rsv"]) >= 4, 180, interval=0.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=150)
    assert not problems, problems
    assert len(made["sbx"]) >= 4, made
    assert len(made["rsv"]) >= 4, made
    for used_v, used_m, size_v, size_m, claimed_v, claimed_m in samples:
        assert used_v <= size_v
        assert used_m <= size_m
        assert (used_v, used_m) == (claimed_v, claimed_m)
    for box in made["sbx"]:  # every VM stops, and then its counters are back
        settled(cpu_stack, box, ("stopped", "failed"), timeout=60)
    with psycopg.connect(cpu_stack.env["DATABASE_URL"]) as db:
        [(used_v, used_m, *_)] = db.execute(DRIFT, [pool]).fetchall()
        overlaps = db.execute(
            "SELECT count(*) FROM reservations_booking a JOIN reservations_booking b "
            "ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during").fetchone()
    assert (used_v, used_m, overlaps[0]) == (0, 0, 0)
    assert not list(root.glob("var/lib/bcd/vms/*"))
    left = {box: qemu_processes(box) for box in made["sbx"] if qemu_processes(box)}
    assert not left, [sandbox(cpu_stack, box) for box in left]
    ends = [sandbox(cpu_stack, b) for b in made["sbx"]]
    assert [b for b in ends if b["startedAt"]], [b["failureReason"] for b in ends]  # booted


def test_an_agent_killed_between_starting_qemu_and_journaling_it_adopts_never_starts_two(
        tmp_path):
    """The gap the journal cannot close by itself: QEMU runs, `vm-start` is not yet done.
    The restarted keeper finds it by its pidfile; and QEMU's own lock on that pidfile
    refuses a second QEMU for the sandbox even if one were started."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from bcd import qemu
    from bcd.config import Paths
    from bcd.contract import ids
    from bcd.contract.crypto import canonical, sign_bytes
    from bcd.contract.vms import Vm
    from bcd.journal import Journal
    from bcd.vms import VmKeeper, VmTuning, vm_states
    from compute.cli.guestimage import build, sha256_of

    parts = build(tmp_path / "image")
    wire = {name: {"url": path.as_uri(), "sha256": sha256_of(path)}
            for name, path in parts.items()}
    vm = Vm.from_wire({"sandboxId": ids.new("sbx"), "vcpus": 1, "memoryMiB": 256, **wire})
    paths = Paths(tmp_path / "node")
    key = ec.generate_private_key(ec.SECP256R1())

    def keeper() -> tuple[VmKeeper, list[tuple[str, str, str]]]:
        sent: list[tuple[str, str, str]] = []
        made = VmKeeper(paths=paths, journal=Journal(paths.state_dir / "journal.jsonl"),
                        node_id="node_x", send=sent.extend, sign=lambda kind, payload: (
                            kind, canonical(payload).decode(),
                            sign_bytes(key, canonical(payload))),
                        tuning=VmTuning(shutdown_grace=2))
        made.accelerator = "tcg"
        return made, sent

    first, _ = keeper()
    first.journal.begin("vm-start", vm.sandbox_id, vm=vm.wire(), at=time.time())
    files = qemu.VmFiles.of(paths, vm.sandbox_id)
    qemu.prepare_disk(vm, files, None)
    argv = qemu.qemu_argv(vm, files, accel="tcg", kernel=parts["kernel"],
                          initrd=parts["initrd"])
    try:
        qemu.launch(vm, files, argv, slice_name=None)  # ... and the agent dies here
        [pid] = qemu_processes(vm.sandbox_id)

        second = subprocess.run(argv, cwd=files.folder, capture_output=True, text=True,
                                timeout=30, check=False)
        assert second.returncode != 0
        assert "pid" in second.stderr.lower()  # "Cannot lock pid file"
        assert qemu_processes(vm.sandbox_id) == [pid]

        restarted, sent = keeper()
        restarted.want([vm])
        asyncio.run(restarted.converge())
        assert qemu_processes(vm.sandbox_id) == [pid]  # adopted, not started again
        assert vm_states(restarted.journal)[vm.sandbox_id]["state"] == "starting"
        assert [json.loads(body)["phase"] for _, body, _ in sent] == []
        restarted.want([])
        asyncio.run(restarted.converge())
        assert qemu_processes(vm.sandbox_id) == []
        assert [json.loads(body)["phase"] for _, body, _ in sent] == ["stopped"]
    finally:
        for leftover in qemu_processes(vm.sandbox_id):
            os.kill(leftover, signal.SIGKILL)


def run_in(stack: Stack, sandbox_id: str, *argv: str, timeout: float = 30) -> dict[str, Any]:
    """`sandboxes exec` as a program runs it: its JSON answer (the exit code is the
    command's own, so it is not checked here)."""
    done = stack.cli("sandboxes", "exec", sandbox_id, "--timeout", str(timeout),
                     "--output", "json", "--", *argv, timeout=timeout + 60)
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


@contextlib.contextmanager
def host_server() -> Iterator[int]:
    """An HTTP server on the host's loopback (what a guest reaches as 10.0.2.2); its port."""
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "3")
            self.end_headers()
            self.wfile.write(b"ok\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def counter(stack: Stack, sandbox_id: str) -> int:
    return int(run_in(stack, sandbox_id, "cat", "/run/n")["stdout"])


def test_a_sandbox_runs_commands_moves_files_pauses_and_keeps_to_its_network(cpu_stack,
                                                                            tmp_path):
    pool = cpu_stack.env["CPU_POOL"]
    expiring = cpu_stack.json("sandboxes", "create", "--pool", pool, "--vcpus", "1",
                              "--memory", "1", "--timeout", "10")
    closed = cpu_stack.json("sandboxes", "create", "--pool", pool, "--vcpus", "1", "--memory",
                            "1", "--wait", "--wait-timeout", str(BOOT), timeout=BOOT + 30)
    assert (closed["state"], closed["network"]) == ("running", "none"), closed
    said = run_in(cpu_stack, closed["id"], "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (said["exitCode"], said["stdout"], said["stderr"], said["timedOut"]) == (
        3, "out\n", "err\n", False)
    shown = cpu_stack.cli("sandboxes", "exec", closed["id"], "--", "echo", "hello")
    assert (shown.returncode, shown.stdout) == (0, "hello\n")
    followed = cpu_stack.cli("sandboxes", "exec", closed["id"], "--follow", "--", "sh", "-c",
                             "echo one; sleep 1; echo two >&2; echo three; exit 5",
                             timeout=90)
    assert (followed.returncode, followed.stdout) == (5, "one\nthree\n"), followed.stderr
    assert "two\n" in followed.stderr
    started = time.monotonic()
    killed = run_in(cpu_stack, closed["id"], "sh", "-c", "sleep 60; echo late", timeout=2)
    assert (killed["timedOut"], killed["exitCode"], killed["stdout"]) == (True, 137, "")
    assert time.monotonic() - started < 30

    original = os.urandom(1 << 20)
    (tmp_path / "in").write_bytes(original)
    cpu_stack.ok("sandboxes", "put", closed["id"], str(tmp_path / "in"), "/run/blob")
    cpu_stack.ok("sandboxes", "get", closed["id"], "/run/blob", str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == original
    missing = cpu_stack.cli("sandboxes", "get", closed["id"], "/run/none", str(tmp_path / "x"))
    assert missing.returncode != 0
    assert "failed_precondition" in missing.stderr, missing.stderr  # the guest's refusal, 4xx
    assert not (tmp_path / "x").exists()
    too_big = cpu_stack.cli("sandboxes", "put", closed["id"], "/dev/stdin", "/run/x",
                            stdin="x" * (5 << 19))  # 2.5 MiB: above the pool limit (2 MiB)
    assert too_big.returncode != 0
    assert "content" in too_big.stderr, too_big.stderr

    run_in(cpu_stack, closed["id"], "sh", "-c",
           "(i=0; while true; do i=$((i+1)); echo $i > /run/n; sleep 0.1; done) "
           ">/dev/null 2>&1 &", timeout=600)
    first, before = counter(cpu_stack, closed["id"]), time.monotonic()
    time.sleep(2)
    at_pause, paused_from = counter(cpu_stack, closed["id"]), time.monotonic()
    rate = (at_pause - first) / (paused_from - before)
    assert rate > 0
    assert cpu_stack.json("sandboxes", "pause", closed["id"])["desired"] == "paused"
    settled(cpu_stack, closed["id"], ("paused",), timeout=30)
    paused_at = time.monotonic()
    refused = cpu_stack.cli("sandboxes", "exec", closed["id"], "--", "true")
    assert refused.returncode != 0
    assert "paused" in refused.stderr
    time.sleep(max(0.0, 5 - (time.monotonic() - paused_at)))
    resumed_at = time.monotonic()
    cpu_stack.json("sandboxes", "resume", closed["id"])
    settled(cpu_stack, closed["id"], ("running",), timeout=30)
    after = counter(cpu_stack, closed["id"])
    elapsed, asleep = time.monotonic() - paused_from, resumed_at - paused_at
    assert after >= at_pause  # the guest's memory kept its value
    # Running all along, it would have counted `rate * elapsed`; paused, at most what the
    # time around the pause allows (half the paused time is slack for a busy machine).
    assert after - at_pause < rate * (elapsed - asleep / 2), (rate, at_pause, after, elapsed)

    open_one = cpu_stack.json("sandboxes", "create", "--pool", pool, "--vcpus", "1",
                              "--memory", "1", "--network", "outbound", "--wait",
                              "--wait-timeout", str(BOOT), timeout=BOOT + 30)
    assert open_one["network"] == "outbound"
    # A server of the host's own, not the API: the API's thread that waits for this
    # command's result must not be what the guest's request waits for.
    with host_server() as port:
        reach = ("wget", "-q", "-O", "/dev/null", f"http://10.0.2.2:{port}/")
        assert run_in(cpu_stack, open_one["id"], *reach, timeout=60)["exitCode"] == 0
        assert run_in(cpu_stack, closed["id"], *reach, timeout=60)["exitCode"] != 0

    ended = settled(cpu_stack, expiring["id"], ("stopping", "stopped", "failed"), timeout=60)
    lived = (datetime.fromisoformat(ended["releasedAt"].replace("Z", "+00:00"))
             - datetime.fromisoformat(ended["createdAt"].replace("Z", "+00:00")))
    assert 10 <= lived.total_seconds() <= 60, ended  # released by its limit, not before
    for sandbox_id in (closed["id"], open_one["id"]):
        cpu_stack.json("sandboxes", "release", sandbox_id)
    for sandbox_id in (closed["id"], open_one["id"], expiring["id"]):
        settled(cpu_stack, sandbox_id, ("stopped",), timeout=60)
    assert [r for r in cpu_stack.json("audit", "list", "--target", expiring["id"])["items"]
            if r["action"] == "sandbox.expire"], "released by its time limit"
    meters = cpu_stack.json("usage", "list", "--subject", closed["id"],
                            "--meter", "vcpu.hours")["items"]
    assert len(meters) >= 3  # running, paused (at the pool's lower rate), running again


def test_an_agent_killed_mid_exec_reports_the_result_once_and_the_sandbox_stays_usable(
        cpu_stack):
    created = cpu_stack.json("sandboxes", "create", "--pool", cpu_stack.env["CPU_POOL"],
                             "--vcpus", "1", "--memory", "1", "--wait", "--wait-timeout",
                             str(BOOT), timeout=BOOT + 30)
    answer: dict[str, Any] = {}

    def run() -> None:
        answer.update(run_in(cpu_stack, created["id"], "sh", "-c",
                             "sleep 5; echo finished; exit 7", timeout=60))

    def started_in_guests() -> int:  # the journal's records of commands the guest started
        return sum(line.count('"kind": "exec"') for path in (cpu_stack.state_dir / "sim").glob(
            "*/var/lib/bcd/journal.jsonl") for line in path.read_text().splitlines())

    before = started_in_guests()
    worker = threading.Thread(target=run)
    worker.start()
    assert wait_until(lambda: started_in_guests() > before, 60, interval=0.05)
    os.kill(agent_pid(cpu_stack, created["nodeId"]), signal.SIGKILL)  # while it runs
    worker.join(timeout=120)
    assert (answer.get("exitCode"), answer.get("stdout")) == (7, "finished\n"), answer
    records = [json.loads(line) for path in (cpu_stack.state_dir / "sim").glob(
        "*/var/lib/bcd/journal.jsonl") for line in path.read_text().splitlines()]
    done = [r for r in records if r.get("kind") == "command" and r.get("phase") == "done"
            and r.get("key") == answer["commandId"]]
    assert len(done) == 1  # one result, journaled once
    runs = [line for path in (cpu_stack.state_dir / "sim").glob(
        "*/var/lib/bcd/executions.log") for line in path.read_text().splitlines()
        if answer["commandId"] in line]
    assert len(runs) == 1  # started once, not again after the restart
    assert run_in(cpu_stack, created["id"], "echo", "again")["stdout"] == "again\n"

    async def over_mcp() -> Any:
        async with over_stdio(cpu_stack.env["BETTER_COMPUTE_URL"],
                              cpu_stack.env["BETTER_COMPUTE_TOKEN"]) as session:
            return await session.call_tool("sandbox_run", {
                "sandboxId": created["id"], "command": "echo from-mcp; uname -s; exit 4"})

    ran = asyncio.run(over_mcp())
    assert not ran.is_error, ran.content
    assert (ran.structured_content["stdout"], ran.structured_content["exitCode"]) == (
        "from-mcp\nLinux\n", 4)
    cpu_stack.json("sandboxes", "release", created["id"])
    settled(cpu_stack, created["id"], ("stopped",), timeout=60)
