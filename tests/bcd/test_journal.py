"""The agent's journal: nothing runs twice across crashes; a lost journal is a new epoch.

A crash is simulated by dropping the Agent object mid-step (the journal on disk is all that
survives, exactly as after kill -9) and building a new one from the same root.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bcd.agent import Agent
from bcd.config import Config, Paths
from bcd.contract import ids
from bcd.contract.crypto import verify_bytes
from bcd.contract.holds import BadHold
from bcd.journal import Journal


class Crash(BaseException):
    """Stands for kill -9: nothing after it runs, nothing is cleaned up."""


def agent(root: Path, side_effects: list[str], crash_at: str | None = None) -> Agent:
    instance = Agent(Config.read(Paths(root).config_file))

    async def execute(kind, payload):
        if crash_at == "before-act":
            raise Crash
        side_effects.append(kind)
        if crash_at == "after-act":
            raise Crash
        return "succeeded", {"ran": kind}

    instance._execute = execute
    return instance


def run(instance, command_id="cmd_1"):
    return asyncio.run(instance.run_command(command_id, "diag.disk", {}))


def test_a_command_is_run_once_and_a_redelivery_gets_the_recorded_result(root):
    effects: list[str] = []
    first = run(agent(root, effects))
    again = run(agent(root, effects))  # restarted agent, same command delivered again
    assert first == again == ("succeeded", {"ran": "diag.disk"})
    assert effects == ["diag.disk"]


@pytest.mark.parametrize("moment", ["before-act", "after-act"])
def test_a_crash_mid_command_never_runs_it_again(root, moment):
    effects: list[str] = []
    with pytest.raises(Crash):
        run(agent(root, effects, crash_at=moment))
    status, output = run(agent(root, effects))  # restarted; the command is redelivered
    assert status == "unknown"
    assert "not run again" in output["error"]
    assert effects == ([] if moment == "before-act" else ["diag.disk"])


A = {name: ids.new("alloc") for name in ("a", "b", "ok", "gone", "clash", "s")}


def hold(allocation, gpus):
    """A NodeSpec entry as the control plane writes it: ids and GPU UUIDs only."""
    return {"allocationId": allocation, "reservationId": ids.new("rsv"), "gpus": gpus,
            "kubernetes": False}


def gpus_of(root, count):
    return [g["uuid"] for g in agent(root, []).inventory.report()["gpus"]][:count]


def test_an_agent_killed_before_its_reports_left_asks_for_the_spec_again(root):
    """Spec 1 applied and journaled whole, the process killed before its bound report
    reached the gateway: the restarted agent says it applied nothing, so the newest spec
    comes again and the report is made anew (the reservation would stay binding)."""
    (gpu,) = gpus_of(root, 1)
    spec = {"allocations": [hold(A["b"], [gpu])]}
    first = agent(root, [])
    assert first.hello_generation() == 0
    assert [kind for kind, _, _ in first.apply_spec(1, spec)] == ["bound"]
    assert first.hello_generation() == 1
    restarted = agent(root, [])  # kill -9: the reports in memory are gone
    assert restarted.journal.applied_generation() == 1
    assert restarted.hello_generation() == 0
    assert restarted.spec_reports == []
    assert [kind for kind, _, _ in restarted.apply_spec(1, spec)] == ["bound"]
    assert restarted.hello_generation() == 1


def test_holds_converge_after_a_crash_and_reports_are_signed(root):
    first, second = gpus_of(root, 2)
    spec = {"allocations": [hold(A["a"], [first, second])]}
    crashing = agent(root, [])
    original = crashing.journal.done

    def crash_after_hold(kind, key, **data):
        original(kind, key, **data)
        if kind == "hold":
            raise Crash  # files written and journaled, report never sent

    crashing.journal.done = crash_after_hold
    with pytest.raises(Crash):
        crashing.apply_spec(1, spec)
    restarted = agent(root, [])
    assert restarted.journal.applied_generation() == 0  # generation 1 was not finished
    reports = restarted.apply_spec(1, spec)
    assert [kind for kind, _, _ in reports] == ["bound"]
    _kind, body, signature = reports[0]
    public = (root / "public.pem").read_text()
    assert verify_bytes(public, body.encode(), signature)
    assert json.loads(body)["cdiDevices"] == sorted([f"bcd.dev/gpu={first}",
                                                     f"bcd.dev/gpu={second}"])
    cdi = json.loads((root / f"etc/cdi/bcd-{A['a']}.json").read_text())
    assert [d["name"] for d in cdi["devices"]] == [first, second]
    assert restarted.journal.applied_generation() == 1
    released = restarted.apply_spec(2, {"allocations": []})
    assert [kind for kind, _, _ in released] == ["released"]
    assert restarted.hello_generation() == 2
    assert not (root / f"etc/cdi/bcd-{A['a']}.json").exists()
    assert not (root / f"run/bcd/allocations/{A['a']}.env").exists()


def test_an_older_generation_is_ignored(root):
    instance = agent(root, [])
    instance.apply_spec(3, {"allocations": [hold(A["a"], gpus_of(root, 1))]})
    assert instance.apply_spec(2, {"allocations": []}) == []
    assert (root / f"etc/cdi/bcd-{A['a']}.json").exists()


def test_vendor_cdi_edits_are_copied_for_exactly_the_held_gpus(root):
    uuids = gpus_of(root, 4)
    vendor = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [
        {"name": uuid, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{n}"}]}}
        for n, uuid in enumerate(uuids)]}
    (root / "etc/cdi").mkdir(parents=True, exist_ok=True)
    (root / "etc/cdi/nvidia.json").write_text(json.dumps(vendor))
    agent(root, []).apply_spec(1, {"allocations": [hold(A["b"], [uuids[1], uuids[3]])]})
    cdi = json.loads((root / f"etc/cdi/bcd-{A['b']}.json").read_text())
    assert [d["containerEdits"]["deviceNodes"][0]["path"] for d in cdi["devices"]] == [
        "/dev/nvidia1", "/dev/nvidia3"]


def test_a_lost_journal_starts_a_new_epoch_and_a_torn_line_is_ignored(root):
    path = Paths(root).state_dir / "journal.jsonl"
    first = Journal(path).epoch
    with path.open("a") as handle:
        handle.write('{"kind": "command", "key": "cmd_9", "pha')  # torn by a crash
    journal = Journal(path)
    assert journal.epoch == first
    journal.done("command", "cmd_8", status="succeeded", output={})
    assert Journal(path).state("command", "cmd_8")["status"] == "succeeded"
    path.unlink()
    assert Journal(path).epoch != first


def test_a_hold_of_gpus_the_machine_lacks_is_reported_failed_not_written(root):
    instance = agent(root, [])
    gpus = [g["uuid"] for g in instance.inventory.report()["gpus"]]
    reports = instance.apply_spec(1, {"allocations": [
        hold(A["ok"], gpus[:2]), hold(A["gone"], ["GPU-not-here"]),
        hold(A["clash"], gpus[1:3])]})
    kinds = {json.loads(body)["allocationId"]: kind for kind, body, _ in reports}
    assert kinds == {A["ok"]: "bound", A["gone"]: "failed", A["clash"]: "failed"}
    reasons = {json.loads(b)["allocationId"]: json.loads(b).get("reason") for _, b, _ in reports}
    assert (reasons[A["gone"]], reasons[A["clash"]]) == ("device-missing", "overlap")
    assert not (root / f"etc/cdi/bcd-{A['gone']}.json").exists()


def test_slices_go_through_systemd_where_it_runs_and_stop_only_when_empty(root, monkeypatch,
                                                                           tmp_path):
    calls = tmp_path / "calls"
    tasks = tmp_path / "tasks"
    tasks.write_text("3")
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n'
                    f'[ "$1" = show ] && cat {tasks}\nexit 0\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    (root / "run/systemd/system").mkdir(parents=True)
    instance = agent(root, [])
    gpus = gpus_of(root, 1)
    instance.apply_spec(1, {"allocations": [hold(A["s"], gpus)]})
    assert (root / f"run/systemd/system/bcd-alloc-{A['s']}.slice").exists()
    assert f"start bcd-alloc-{A['s']}.slice" in calls.read_text()
    instance.apply_spec(2, {"allocations": []})  # a workload still runs: the slice stays
    assert "stop" not in calls.read_text()
    assert (root / f"run/systemd/system/bcd-alloc-{A['s']}.slice").exists()
    assert list(instance.busy_slices) == [A["s"]]
    tasks.write_text("0")  # the workload has gone: the agent's next check stops the slice

    async def one_check():
        task = asyncio.create_task(instance.stop_empty_slices(interval=0.01))
        await asyncio.sleep(0.2)
        task.cancel()

    asyncio.run(one_check())
    assert f"stop bcd-alloc-{A['s']}.slice" in calls.read_text()
    assert instance.busy_slices == {}


@pytest.mark.parametrize("entry", [
    {"allocationId": "alloc_../../etc/cron.d/x"},
    {"allocationId": "rsv_01jbx0000000000000000000zz"},
    {"gpus": ["GPU-ok", "../../dev/mem"]},
    {"gpus": []},
    {"kubernetes": "yes"},
])
def test_a_spec_with_a_malformed_hold_is_refused_whole(root, entry):
    instance = agent(root, [])
    good = hold(A["ok"], gpus_of(root, 1))
    bad = {**hold(A["b"], gpus_of(root, 2)[1:]), **entry}
    with pytest.raises(BadHold):
        instance.apply_spec(1, {"allocations": [good, bad]})
    assert not (root / "etc/cdi").exists() or not list((root / "etc/cdi").iterdir())
    assert instance.journal.applied_generation() == 0


def test_paths_come_from_the_allocation_id_not_from_the_spec(root):
    entry = {**hold(A["a"], gpus_of(root, 1)), "envFile": "/etc/shadow",
             "cgroupParent": "../../../etc/systemd/system/evil.slice"}
    reports = agent(root, []).apply_spec(1, {"allocations": [entry]})
    bound = json.loads(reports[0][1])
    assert bound["envFile"] == f"/run/bcd/allocations/{A['a']}.env"
    assert bound["cgroupParent"] == f"/bcd/alloc-{A['a']}"  # no systemd under this root
    assert (root / f"run/bcd/allocations/{A['a']}.env").exists()
    assert not (root / "etc/shadow").exists()


class RecordingSession:
    """Stands for a new session to the gateway: records what the agent queues on it."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, str, str]] = []
        self.state = SimpleNamespace(connected=True, node_id="n", epoch=2)

    def send_inventory(self, report):
        return "inventory"

    def send_reports(self, reports):
        self.reports.extend(reports)


def test_a_new_session_gets_the_last_specs_reports_again(root):
    """A bound report queued on a session that died before its gateway took it is sent
    again on the next session, signed as before."""
    instance = agent(root, [])
    sent = instance.apply_spec(1, {"allocations": [hold(A["a"], gpus_of(root, 1))]})
    assert [kind for kind, _, _ in sent] == ["bound"]
    instance.session = RecordingSession()  # the first session died with the report queued
    instance._welcomed(instance.session.state)
    assert instance.session.reports == sent
    released = instance.apply_spec(2, {"allocations": []})
    instance.session = RecordingSession()
    instance._welcomed(instance.session.state)
    assert instance.session.reports == released


def test_a_spec_reports_what_it_changed_and_a_new_session_gets_every_hold(root):
    """A spec that adds a hold beside one already bound reports the new hold alone (one
    report per change, not one per hold on the node); the first spec a process applies
    reports every hold, and a new session gets them all again."""
    first, second = gpus_of(root, 2)
    one = hold(A["a"], [first])
    instance = agent(root, [])
    assert [json.loads(b)["allocationId"] for _, b, _ in instance.apply_spec(1, {
        "allocations": [one]})] == [A["a"]]
    added = instance.apply_spec(2, {"allocations": [one, hold(A["b"], [second])]})
    assert [(kind, json.loads(body)["allocationId"]) for kind, body, _ in added] == \
        [("bound", A["b"])]
    instance.session = RecordingSession()
    instance._welcomed(instance.session.state)
    assert sorted(json.loads(b)["allocationId"] for _, b, _ in instance.session.reports) == \
        sorted([A["a"], A["b"]])
    dropped = instance.apply_spec(3, {"allocations": [one]})
    assert [(kind, json.loads(body)["allocationId"]) for kind, body, _ in dropped] == \
        [("released", A["b"])]
    restarted = agent(root, [])  # a new process: what it holds is reported again
    assert [(kind, json.loads(body)["allocationId"]) for kind, body, _ in restarted.apply_spec(
        4, {"allocations": [one]})] == [("bound", A["a"])]


def test_holds_a_lost_journal_forgot_are_removed_by_the_next_spec_that_drops_them(root):
    first, second = gpus_of(root, 2)
    agent(root, []).apply_spec(1, {"allocations": [hold(A["a"], [first]),
                                                   hold(A["b"], [second])]})
    (Paths(root).state_dir / "journal.jsonl").unlink()  # lost with the disk, files stay
    restarted = agent(root, [])
    assert set(restarted.held()) == {A["a"], A["b"]}  # read back from the hold files
    reports = restarted.apply_spec(1, {"allocations": [hold(A["b"], [second])]})
    assert sorted(kind for kind, _, _ in reports) == ["bound", "released"]
    assert not (root / f"run/bcd/allocations/{A['a']}.env").exists()
    assert not (root / f"etc/cdi/bcd-{A['a']}.json").exists()
    assert (root / f"run/bcd/allocations/{A['b']}.env").exists()


def test_a_preempted_hold_gets_its_notice_beside_the_env_file_and_loses_it_when_withdrawn(
        root):
    from bcd.agent import status_text

    instance = agent(root, [])
    entry = hold(A["a"], gpus_of(root, 1))
    notice = root / "run/bcd/allocations" / f"{A['a']}.preempt"
    instance.apply_spec(1, {"allocations": [entry]})
    assert not notice.exists()
    env = (root / "run/bcd/allocations" / f"{A['a']}.env").read_text()
    assert f"BCD_PREEMPT_NOTICE=/run/bcd/allocations/{A['a']}.preempt" in env
    deadline = "2026-12-04T16:02:00+00:00"
    reports = instance.apply_spec(2, {"allocations": [{**entry, "preemptAt": deadline}]})
    assert [kind for kind, _, _ in reports] == ["bound"]  # still held, told its deadline
    assert json.loads(notice.read_text()) == {"reservationId": entry["reservationId"],
                                              "preemptAt": deadline}
    shown = instance.status()
    assert [h["preemptAt"] for h in shown["holds"]] == [deadline]
    assert f"preempting  {A['a']} ({entry['reservationId']}) at {deadline}" in status_text(
        shown)
    instance.apply_spec(3, {"allocations": [entry]})  # the preemption was withdrawn
    assert not notice.exists()
    instance.apply_spec(4, {"allocations": [{**entry, "preemptAt": deadline}]})
    instance.apply_spec(5, {"allocations": []})  # released: nothing of the hold stays
    assert not notice.exists()
    with pytest.raises(BadHold, match="preemptAt"):
        instance.apply_spec(6, {"allocations": [{**entry, "preemptAt": "soon"}]})


def test_a_hold_tells_its_workloads_its_end_and_an_extension_moves_it(root):
    from bcd.agent import status_text

    instance = agent(root, [])
    end, later = "2026-12-04T18:00:00+00:00", "2026-12-04T19:30:00+00:00"
    entry = {**hold(A["a"], gpus_of(root, 2)), "endsAt": end}
    env_file = root / "run/bcd/allocations" / f"{A['a']}.env"
    assert [kind for kind, _, _ in instance.apply_spec(1, {"allocations": [entry]})] == [
        "bound"]
    assert f"BCD_ENDS_AT={end}" in env_file.read_text()
    shown = instance.status()
    assert [h["endsAt"] for h in shown["holds"]] == [end]
    assert f"hold        {A['a']} ({entry['reservationId']}), 2 GPU(s), ends at {end}" in (
        status_text(shown))
    reports = instance.apply_spec(2, {"allocations": [{**entry, "endsAt": later}]})
    assert [kind for kind, _, _ in reports] == ["bound"]  # still held, told its new end
    assert f"BCD_ENDS_AT={later}" in env_file.read_text()
    assert f"BCD_ENDS_AT={end}" not in env_file.read_text()
    with pytest.raises(BadHold, match="endsAt"):
        instance.apply_spec(3, {"allocations": [{**entry, "endsAt": "tonight"}]})
