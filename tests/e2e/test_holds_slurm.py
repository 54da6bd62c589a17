"""A hold published to a real Slurm: this machine runs munged and slurmctld (configured
here, dynamic nodes allowed), `dev` runs one simulated node whose GPUs are real device files,
the pool's policy names the cluster (its nodes then keep the slurmd unit), and a
reservation asked with `--slurm team-a` makes bcd run the node's slurmd offering exactly the
held GPUs in a Slurm reservation for team-a. Jobs of team-a see the held GPUs by UUID and
may open, of the held GPUs, only the device files Slurm gave them; team-b is refused; the
release removes it all."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.test_tutorial_cli import node_root
from tests.support.gpu_files import make_gpu_files
from tests.support.processes import free_port
from tests.support.waiting import wait_until

TOOLS = ("munged", "slurmctld", "slurmd", "srun", "scontrol", "scancel")
# What the job prints: its CUDA_VISIBLE_DEVICES, and per device file whether the job's
# device cgroup lets it open the file (ENXIO: allowed, no driver) or not (EPERM).
PROBE = ('echo "CVD=$CUDA_VISIBLE_DEVICES"; for f in {files}; do '
         'if head -c1 "$f" 2>&1 | grep -q "not permitted"; then echo "denied $f"; '
         'else echo "open $f"; fi; done')


def slurm_conf(folder: Path, sockets: Path, *, cgroups: bool) -> str:
    host = socket.gethostname().split(".")[0]
    lines = [
        "ClusterName=bctest", f"SlurmctldHost={host}(127.0.0.1)",  # no name lookup
        f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={sockets / 'munge.socket'}",
        f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/cgroup" if cgroups else "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/cgroup" if cgroups else "TaskPlugin=task/none",
        "SwitchType=switch/none", "MpiDefault=none", "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
        "GresTypes=gpu", "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none", "MaxNodeCount=8",
        "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """munged and slurmctld for this module; the environment Slurm's clients need."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: install slurm-wlm, slurm-client and munge")
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs as their users and sets device cgroups: it needs root")
    folder = tmp_path_factory.mktemp("slurm")
    # munged wants its socket's folder, and every folder above, open to all: its own.
    sockets = Path(tempfile.mkdtemp(prefix="bcd-munge-"))
    sockets.chmod(0o755)
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    key = folder / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    subprocess.run(["munged", f"--socket={sockets / 'munge.socket'}", f"--key-file={key}",
                    f"--log-file={folder / 'munged.log'}",
                    f"--pid-file={folder / 'munged.pid'}",
                    f"--seed-file={folder / 'munged.seed'}"], check=True, timeout=30)
    cgroups = Path("/sys/fs/cgroup/devices").is_dir()  # cgroup v1's device controller
    (folder / "slurm.conf").write_text(slurm_conf(folder, sockets, cgroups=cgroups))
    (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
                                        "ConstrainDevices=yes\n")
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    subprocess.run(["slurmctld", "-i"], env=env, check=True, timeout=30)
    try:
        assert wait_until(lambda: b"UP" in subprocess.run(
            ["scontrol", "ping"], env=env, capture_output=True, timeout=10).stdout,
            timeout=30), "slurmctld did not come up"
        yield {"SLURM_CONF": env["SLURM_CONF"], "cgroups": "yes" if cgroups else ""}
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True, timeout=30,
                       check=False)
        subprocess.run(["munged", f"--socket={sockets / 'munge.socket'}", "--stop"],
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(sockets, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, slurm) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("slurm-dev"), "--sim", "1",
                          env_extra={"SLURM_CONF": slurm["SLURM_CONF"]})
    yield running
    stop_stack(running)


def slurm_run(slurm: dict[str, str], *argv: str,
              timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env={**os.environ, "SLURM_CONF": slurm["SLURM_CONF"]},
                          capture_output=True, text=True, timeout=timeout, check=False)


def unit(stack: Stack, node_id: str, name: str) -> dict:
    return {"state": "", "reason": "", **stack.profile_unit(node_id, name)}


def assert_held_only(output: str, held: list[str]) -> None:
    """The job named exactly the held GPUs in CUDA_VISIBLE_DEVICES."""
    line = next(x for x in output.splitlines() if x.startswith("CVD="))
    assert sorted(line.removeprefix("CVD=").split(",")) == sorted(held), (line, held)


def test_a_slurm_hold_runs_only_its_accounts_jobs_on_exactly_its_gpus(stack, slurm, tmp_path):
    pool = stack.env["POOL"]
    node = stack.json("nodes", "list")["items"][0]
    stack.add_to_policy(tmp_path, slurm={"cluster": "bctest", "partition": "gpu"})  # +slurmd
    assert wait_until(lambda: unit(stack, node["id"], "slurmd")["state"] == "ready",
                      timeout=60), unit(stack, node["id"], "slurmd")
    ready = unit(stack, node["id"], "slurmd")
    assert ready["reason"] == "no Slurm hold on this node"
    assert ready["generation"] >= 2  # the spec that the new policy wrote

    root = node_root(stack, node["id"])
    gpus = {d["uuid"]: d["index"] for d in stack.json("nodes", "get", node["id"])["devices"]
            if d["class"] == "gpu"}
    make_gpu_files(root, len(gpus))
    rsv = stack.json("reserve", "--pool", pool, "--gpus", "2", "--for", "1h",
                     "--slurm", "team-a")
    assert rsv["state"] == "active", rsv["failureReason"]
    assert rsv["slurm"] == "team-a"
    held = [device.split("=", 1)[1] for device in rsv["binding"]["cdiDevices"]]
    assert wait_until(lambda: rsv["id"] in unit(stack, node["id"], "slurmd")["reason"],
                      timeout=90), unit(stack, node["id"], "slurmd")
    shown = slurm_run(slurm, "scontrol", "show", f"ReservationName={rsv['id']}").stdout
    assert "Accounts=team-a" in shown
    assert "PartitionName=gpu" in shown

    files = {uuid: str(root / "dev" / f"nvidia{gpus[uuid]}") for uuid in held}
    probe = PROBE.format(files=" ".join(files.values()))
    both = slurm_run(slurm, "srun", "--account=team-a", f"--reservation={rsv['id']}",
                     "--gres=gpu:2", "sh", "-c", probe)
    assert both.returncode == 0, both.stderr
    assert_held_only(both.stdout, held)
    with pytest.raises(AssertionError):  # the check fails on a wrong hold
        assert_held_only(both.stdout, [held[0], next(u for u in gpus if u not in held)])
    one = slurm_run(slurm, "srun", "--account=team-a", f"--reservation={rsv['id']}",
                    "--gres=gpu:1", "sh", "-c", probe)
    assert one.returncode == 0, one.stderr
    given = one.stdout.split("CVD=", 1)[1].split()[0]
    assert given in held
    if slurm["cgroups"]:  # the job's device cgroup: its own GPU only, of those Slurm has
        assert f"open {files[given]}" in one.stdout
        other = next(u for u in held if u != given)
        assert f"denied {files[other]}" in one.stdout, one.stdout
    more = slurm_run(slurm, "srun", "--account=team-a", f"--reservation={rsv['id']}",
                     "--gres=gpu:3", "--immediate=5", "true")
    assert more.returncode != 0  # only the held GPUs are Slurm's
    other = slurm_run(slurm, "srun", "--account=team-b", f"--reservation={rsv['id']}",
                      "--gres=gpu:1", "true")
    assert other.returncode != 0
    assert "Access denied" in other.stderr, other.stderr

    status = subprocess.run([sys.executable, "-m", "bcd", "--root", str(root), "status"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert "unit        slurmd ready (generation" in status.stdout, status.stdout
    assert rsv["id"] in status.stdout

    # An extension moves the Slurm reservation's end with the hold's.
    end_of = lambda: slurm_run(slurm, "scontrol", "show",  # noqa: E731
                               f"ReservationName={rsv['id']}").stdout.split("EndTime=")[1][:19]
    before = end_of()
    stack.ok("extend", rsv["id"], "--by", "2h")
    assert wait_until(lambda: end_of() > before, timeout=60), (before, end_of())
    assert (datetime.fromisoformat(end_of()) - datetime.fromisoformat(before)).seconds \
        == 7200

    assert stack.ok("release", rsv["id"], "--query", "state") == "released"
    assert wait_until(lambda: slurm_run(slurm, "scontrol", "show",
                                        f"ReservationName={rsv['id']}").returncode != 0,
                      timeout=60), "the Slurm reservation outlived the hold"
    assert wait_until(lambda: slurm_run(slurm, "scontrol", "show", "node", node["hostname"])
                      .returncode != 0, timeout=60), "the node stayed in Slurm"
    assert wait_until(lambda: unit(stack, node["id"], "slurmd")["reason"]
                      == "no Slurm hold on this node", timeout=60)
