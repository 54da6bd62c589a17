"""The fleet simulator: a CI seed holds every invariant, and a run with a guarantee broken
on purpose fails the invariant that guards it (proof that the simulator can fail)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from compute.cli.sim.schedule import FAULTS, plan

SMALL = ["--nodes", "2", "--minutes", "1.2"]
SCALE = ["--time-scale", "10"]  # ten simulated minutes in one real minute


def simulate(*args: str) -> subprocess.Popen[str]:
    """A run in a session of its own: if it must be stopped, all its processes go."""
    return subprocess.Popen(["better-compute", "sim", "run", *args, "--output", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def report_of(run: subprocess.Popen[str]) -> tuple[int, dict]:
    try:
        out, err = run.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        raise
    assert out.strip(), err[-3000:]
    return run.returncode, json.loads(out.strip().splitlines()[-1])


def test_a_seed_alone_gives_the_plan_and_each_plan_holds_every_fault():
    assert plan(7, 2, 1.5) == plan(7, 2, 1.5)
    assert plan(7, 2, 1.5) != plan(8, 2, 1.5)
    assert {fault.kind for fault in plan(7, 2, 1.5).faults} == set(FAULTS)
    postgres = plan(7, 2, 1.5, only=("postgres-restart", "postgres-kill"))
    assert [f.kind for f in postgres.faults[:4]] == ["postgres-restart", "postgres-kill"] * 2
    assert [f.at for f in postgres.faults] == [f.at for f in plan(7, 2, 1.5).faults]


@pytest.mark.timeout(900)  # two runs, the second at half speed, on busy cores
def test_a_ci_seed_holds_every_invariant_under_its_faults():
    """One seed at a small size (it injects every kind of fault); more seeds, and longer
    ones, are the campaign `python -m bench.sim`. On cores busy with other tests a run can
    end before any of its reservations became active, leaving I6 nothing to judge: such a
    run must hold every invariant too, and the seed is run once more, its clock half as
    fast (the same plan, twice the time for each step)."""
    for scale in ("10", "5"):
        code, report = report_of(simulate("--seed", "1", *SMALL, "--time-scale", scale))
        failed = {k: v for k, v in report["invariants"].items() if not v["ok"]}
        assert not failed, (failed, report["faults"])
        assert code == 0
        assert {f["fault"].split()[0] for f in report["faults"]} == set(FAULTS)
        assert report["outcomes"].get("reservations.create ok", 0) > 0
        # Each check looked at something: commands ran, the API's decisions were counted.
        assert "executions logged" in report["invariants"]["I2"]["summary"]
        assert " 0 executions" not in report["invariants"]["I2"]["summary"]
        assert "(0 by the API" not in report["invariants"]["IAM"]["summary"]
        if report["outcomes"].get("workload started", 0) > 0:  # I6 had workloads to judge
            return
    pytest.fail(f"in two runs no workload started, so I6 judged nothing: {report['outcomes']}")


@pytest.mark.campaign
def test_without_the_exclude_constraints_and_the_journal_i1_and_i2_fail():
    # Every fault a kill after a command ran and before it was reported: each is delivered
    # again, and an agent that ignores its journal runs it twice, however loaded the machine.
    code, report = report_of(simulate("--seed", "5", *SMALL, *SCALE, "--without", "exclude",
                                      "--without", "journal", "--converge-within", "5",
                                      "--faults", "kill-agent-after-act"))
    assert code == 1
    assert not report["invariants"]["I1"]["ok"], report["invariants"]["I1"]
    assert "overlap on one device" in " ".join(report["invariants"]["I1"]["problems"])
    assert not report["invariants"]["I2"]["ok"], (report["invariants"]["I2"], report["faults"])
    assert "times" in " ".join(report["invariants"]["I2"]["problems"])


@pytest.mark.campaign
def test_without_fencing_i6_fails():
    """A pool that only notifies: the workloads outlive their holds. (Its faults leave the
    agents alone, so that the workloads start.)"""
    code, report = report_of(simulate("--seed", "3", *SMALL, *SCALE, "--without", "fence",
                                      "--faults", "kill-gateway"))
    assert code == 1
    assert report["outcomes"].get("workload started", 0) > 0, report["outcomes"]
    assert not report["invariants"]["I6"]["ok"], report["invariants"]["I6"]
    assert "still runs" in " ".join(report["invariants"]["I6"]["problems"])
    assert report["invariants"]["I1"]["ok"], report["invariants"]["I1"]  # only fencing broke
