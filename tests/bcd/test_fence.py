"""A hold's end on the node, with real processes: with `onEnd: fence` every process that holds
one of its GPUs' device files open, or runs in its cgroup, is stopped before the spec that
ends it is done (SIGTERM, then SIGKILL for one that ignores it), and the signed released
report names each by pid; with `notify` they keep running and the report says which they
are. A process on another hold's GPU is never touched. The ending file says, at each notice
time, how long is left."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bcd import fence
from bcd.config import Paths
from bcd.contract import ids
from bcd.contract.holds import BadHold, Hold
from bcd.holds import ending_of, write_ending_notice
from tests.bcd.test_journal import agent, gpus_of, hold
from tests.support.workloads import holding

CGROUPS = Path("/sys/fs/cgroup")


def cgroup_for(path: str) -> Path | None:
    """A writable cgroup at `path` (the hold's cgroupfs path) in one hierarchy, or None."""
    for hierarchy in (CGROUPS / "pids", CGROUPS / "unified", CGROUPS):
        folder = hierarchy / path.lstrip("/")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if (folder / "cgroup.procs").exists():
            return folder
    return None


def in_slice(folder: Path) -> subprocess.Popen[bytes]:
    """A process that puts itself in the cgroup, then sleeps (as a container under the
    hold's cgroup parent would)."""
    code = (f"open({str(folder / 'cgroup.procs')!r}, 'w').write(str(__import__('os')"
            ".getpid()))\nprint('in', flush=True)\nimport time; time.sleep(600)\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline() == b"in\n"
    return process


def released(reports) -> dict:
    [(_, body, _)] = [r for r in reports if r[0] == "released"]
    return json.loads(body)


def ended(process: subprocess.Popen[bytes]) -> bool:
    try:
        process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        return False
    return True


@pytest.fixture
def processes():
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_fence_stops_what_holds_the_devices_or_runs_in_the_slice_and_names_them(
        root, processes):
    node = agent(root, [])
    gpus = gpus_of(root, 3)
    fenced = {**hold(ids.new("alloc"), gpus[:2]), "onEnd": "fence", "fenceGraceSeconds": 1}
    other = hold(ids.new("alloc"), gpus[2:])
    assert [k for k, _, _ in node.apply_spec(1, {"allocations": [fenced, other]})] == [
        "bound", "bound"]
    polite = holding(root / "dev/nvidia0")
    stubborn = holding(root / "dev/nvidia1", ignore_term=True)
    bystander = holding(root / "dev/nvidia2")  # the other hold's GPU
    processes += [polite, stubborn, bystander]
    folder = cgroup_for(Hold.from_wire(fenced).cgroupfs_path)
    assert folder is not None, "no writable cgroup hierarchy: run the tests as root"
    sliced = in_slice(folder)
    processes.append(sliced)

    started = time.monotonic()
    said = released(node.apply_spec(2, {"allocations": [other]}))
    took = time.monotonic() - started
    workloads = said["workloads"]
    assert workloads["onEnd"] == "fence"
    assert sorted((w["pid"], w["signal"]) for w in workloads["stopped"]) == sorted([
        (polite.pid, "SIGTERM"), (stubborn.pid, "SIGKILL"), (sliced.pid, "SIGTERM")])
    assert {w["pid"]: w["why"] for w in workloads["stopped"]}[polite.pid] == \
        "device /dev/nvidia0"
    assert {w["pid"]: w["why"] for w in workloads["stopped"]}[sliced.pid] == "cgroup"
    assert workloads["survived"] == []
    assert all(ended(p) for p in (polite, stubborn, sliced))
    assert not ended(bystander)  # another hold's workload runs on
    assert 1 <= took < 6  # the grace period, then SIGKILL
    folder.rmdir()


def test_notify_leaves_them_running_and_says_which_they_are(root, processes):
    node = agent(root, [])
    [gpu] = gpus_of(root, 1)
    entry = hold(ids.new("alloc"), [gpu])
    node.apply_spec(1, {"allocations": [entry]})
    running = holding(root / "dev/nvidia0")
    processes.append(running)
    said = released(node.apply_spec(2, {"allocations": []}))
    assert said["workloads"]["onEnd"] == "notify"
    assert [(w["pid"], w["why"]) for w in said["workloads"]["running"]] == [
        (running.pid, "device /dev/nvidia0")]
    assert not ended(running)


def test_a_hold_says_what_to_do_at_its_end_or_is_refused():
    base = {"allocationId": ids.new("alloc"), "reservationId": ids.new("rsv"),
            "gpus": ["GPU-a"]}
    assert Hold.from_wire(base).on_end == "notify"  # what the previous release sends
    with pytest.raises(BadHold, match="onEnd"):
        Hold.from_wire({**base, "onEnd": "kill-everything"})
    with pytest.raises(BadHold, match="fenceGraceSeconds"):
        Hold.from_wire({**base, "onEnd": "fence", "fenceGraceSeconds": 3600})
    fence = Hold.from_wire({**base, "onEnd": "fence", "fenceGraceSeconds": 2})
    assert Hold.from_wire(fence.wire()) == fence


def test_the_ending_file_says_each_notice_when_it_falls_due(tmp_path):
    end = datetime.fromisoformat("2027-01-01T12:00:00+00:00")  # (3.10: no datetime.UTC)
    entry = Hold.from_wire({"allocationId": ids.new("alloc"), "reservationId": ids.new("rsv"),
                            "gpus": ["GPU-a"], "endsAt": end.isoformat()})
    paths = Paths(tmp_path)
    file = ending_of(entry, paths)
    file.parent.mkdir(parents=True)
    for before, due in [(timedelta(minutes=16), None), (timedelta(minutes=15), 900.0),
                        (timedelta(minutes=2), 900.0), (timedelta(seconds=60), 60.0),
                        (timedelta(seconds=1), 60.0), (timedelta(0), None)]:
        assert write_ending_notice(entry, paths, end - before) == due, before
        if due is None:
            assert not file.exists()
        else:
            assert json.loads(file.read_text()) == {
                "reservationId": entry.reservation_id, "endsAt": end.isoformat(),
                "noticeSeconds": due}


def test_a_gpu_handed_to_the_next_hold_in_one_spec_is_fenced_before_it_is_held(
        root, processes):
    """One spec ends hold A and gives its GPU to hold B: B's files are written only after
    A's workload was stopped (the journal's order), and the reports say so in that order."""
    node = agent(root, [])
    [gpu] = gpus_of(root, 1)
    first = {**hold(ids.new("alloc"), [gpu]), "onEnd": "fence", "fenceGraceSeconds": 1}
    node.apply_spec(1, {"allocations": [first]})
    stubborn = holding(root / "dev/nvidia0", ignore_term=True)
    processes.append(stubborn)
    second = hold(ids.new("alloc"), [gpu])
    reports = node.apply_spec(2, {"allocations": [second]})
    assert [kind for kind, _, _ in reports] == ["released", "bound"]
    assert stubborn.poll() is not None  # stopped (and reaped) before apply_spec returned
    steps = [(r.get("kind"), r.get("key"), r.get("phase")) for r in node.journal.records
             if r.get("key") in (first["allocationId"], second["allocationId"])]
    fenced = steps.index(("unhold", first["allocationId"], "done"))
    assert fenced < steps.index(("hold", second["allocationId"], "begin"))
    [unheld] = [r for r in node.journal.records if (r.get("kind"), r.get("key"), r.get(
        "phase")) == ("unhold", first["allocationId"], "done")]
    assert [w["pid"] for w in unheld["workloads"]["stopped"]] == [stubborn.pid]


def test_a_gpu_whose_workload_outlived_its_fence_goes_to_no_one_until_it_ends(
        root, processes, monkeypatch):
    """A process SIGKILL cannot end (stuck in the driver, as a process in D state is; here
    the signals to it are dropped) keeps its GPU from the next hold, and the inventory says
    the GPU is unhealthy and why, until the process is gone; a restarted agent still knows."""
    node = agent(root, [])
    [gpu] = gpus_of(root, 1)
    first = {**hold(ids.new("alloc"), [gpu]), "onEnd": "fence", "fenceGraceSeconds": 1}
    node.apply_spec(1, {"allocations": [first]})
    stuck = holding(root / "dev/nvidia0", ignore_term=True)
    processes.append(stuck)
    delivered = fence.send
    monkeypatch.setattr(fence, "send", lambda pid, signum: None if pid == stuck.pid
                        else delivered(pid, signum))
    second = hold(ids.new("alloc"), [gpu])
    reports = node.apply_spec(2, {"allocations": [second]})
    assert [kind for kind, _, _ in reports] == ["released", "failed"]
    assert [w["pid"] for w in released(reports)["workloads"]["survived"]] == [stuck.pid]
    refusal = json.loads(reports[1][1])["reason"]
    assert refusal == f"{gpu}: pid {stuck.pid} of {first['allocationId']} outlived its fence"
    [reported] = [g for g in node._read_inventory()["gpus"] if g["uuid"] == gpu]
    assert (reported["health"], reported["healthReason"]) == (
        "unhealthy", f"pid {stuck.pid} of {first['allocationId']} outlived its fence")
    assert agent(root, []).unclean.why(gpu)  # kept in the agent's state
    stuck.kill()
    stuck.wait()
    [reported] = [g for g in node._read_inventory()["gpus"] if g["uuid"] == gpu]
    assert reported.get("health", "healthy") == "healthy"
    assert [kind for kind, _, _ in node.apply_spec(3, {"allocations": [second]})] == ["bound"]
    assert not agent(root, []).unclean.left
