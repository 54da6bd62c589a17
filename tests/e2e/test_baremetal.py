"""Bare metal against a real Redfish service: sushy-tools' emulator (fake driver) on a
loopback port, enrolled through `dev`'s provisioner (a real `bcd node --provisioner`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid

import psycopg
import pytest

from tests.e2e.conftest import start_stack, stop_stack
from tests.support.redfish import USERNAME, Emulator
from tests.support.waiting import wait_until

PASSWORD = f"bmc-{uuid.uuid4().hex[:12]}-pw"
MACHINES = {name: {"uuid": str(uuid.uuid4()), "name": name, "power_state": "Off",
                   "nics": [{"mac": f"52:54:00:aa:bb:{n:02x}", "ip": f"10.0.0.{n}"}]}
            for n, name in enumerate(["metal-a", "metal-b", "metal-c", "metal-d"], start=1)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = start_stack(tmp_path_factory.mktemp("metal"), "--sim", "0")
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def bmc(tmp_path_factory):
    emulator = Emulator(tmp_path_factory.mktemp("bmc"), PASSWORD,
                        [MACHINES[n] for n in ("metal-a", "metal-b", "metal-c")]).start()
    yield emulator
    emulator.stop()


def credentials(tmp_path, password=PASSWORD):
    path = tmp_path / "bmc.json"
    path.write_text(json.dumps({"username": USERNAME, "password": password}))
    path.chmod(0o600)
    return str(path)


def enroll(stack, emulator, name, creds):
    return stack.cli("nodes", "enroll", "--pool", stack.env["POOL"], "--bmc",
                     emulator.bmc(MACHINES[name]["uuid"]), "--bmc-credentials-file", creds,
                     "--hostname", name, "--wait", "--output", "json", timeout=120)


def node_of(stack, name):
    return next(n for n in stack.json("nodes", "list")["items"] if n["hostname"] == name)


def events(stack, node_id, kind):
    return [e for e in stack.json("nodes", "events", node_id)["items"] if e["type"] == kind]


def test_enroll_verify_inspect_and_power_through_the_bmc(stack, bmc, tmp_path):
    enrolled = enroll(stack, bmc, "metal-a", credentials(tmp_path))
    assert enrolled.returncode == 0, enrolled.stderr
    machine = json.loads(enrolled.stdout)
    assert "verifying" in enrolled.stderr  # the steps as they happen
    system = MACHINES["metal-a"]
    assert (machine["provisionState"], machine["productUuid"], machine["macs"]) == (
        "available", system["uuid"], [system["nics"][0]["mac"]])
    assert machine["bmc"]["reachable"] is True
    assert not machine["schedulable"]
    for state, shown in (("on", "On"), ("off", "Off"), ("cycle", "On")):
        powered = stack.json("nodes", "power", machine["id"], state, "--wait", timeout=120)
        assert powered["bmc"]["powerState"] == shown
        assert bmc.system(system["uuid"])["PowerState"] == shown
    assert bmc.requests("POST", f"{system['uuid']}/Actions/ComputerSystem.Reset") == 3
    results = events(stack, machine["id"], "node.power")
    assert [(e["payload"]["state"], e["payload"]["powerState"], e["payload"]["error"])
            for e in results] == [("on", "On", ""), ("off", "Off", ""), ("cycle", "On", "")]


def test_wrong_credentials_fail_verification_with_the_bmcs_answer(stack, bmc, tmp_path):
    refused = enroll(stack, bmc, "metal-b", credentials(tmp_path, password="not-it"))
    assert refused.returncode == 1
    assert "verify-failed" in refused.stderr
    assert "refused the credentials" in refused.stderr
    machine = node_of(stack, "metal-b")
    assert machine["provisionState"] == "verify-failed"
    assert "401" in machine["provisionError"]
    aborted = stack.json("nodes", "abort", machine["id"], "--reason", "wrong password file")
    assert aborted["provisionState"] == "enrolled"


def test_a_bmc_that_stops_answering_marks_the_node_and_changes_nothing_else(
        stack, tmp_path_factory, tmp_path):
    lone = Emulator(tmp_path_factory.mktemp("lone-bmc"), PASSWORD, [MACHINES["metal-d"]])
    lone.start()
    try:
        assert enroll(stack, lone, "metal-d", credentials(tmp_path)).returncode == 0
        machine = node_of(stack, "metal-d")
        lone.stop()
        cut = stack.cli("nodes", "power", machine["id"], "on", "--wait", timeout=120)
        assert cut.returncode == 1
        assert "did not answer" in cut.stderr
        after = node_of(stack, "metal-d")
        assert after["provisionState"] == "available"
        assert after["bmc"]["reachable"] is False
        assert {"type": "BmcReachable", "status": False, "reason": "bmc-unreachable"} in \
            after["conditions"]
        assert len(events(stack, machine["id"], "node.bmc.unreachable")) == 1
        lone.start()
        back = stack.json("nodes", "power", machine["id"], "on", "--wait", timeout=120)
        assert back["bmc"] == {**back["bmc"], "reachable": True, "powerState": "On"}
        assert len(events(stack, machine["id"], "node.bmc.reachable")) == 2
    finally:
        lone.stop()


def provisioner_pid(stack) -> int | None:
    listing = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True,
                             check=True).stdout
    root = stack.state_dir / "provisioner"
    for line in listing.splitlines():
        if f"--root {root} node --provisioner" in line:
            return int(line.split()[0])
    return None


def journal_begun(stack) -> list[str]:
    path = stack.state_dir / "provisioner/var/lib/bcd/journal.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["key"] for r in rows if r.get("phase") == "begin"]


def test_a_provisioner_killed_mid_power_action_does_not_power_twice(stack, bmc, tmp_path):
    """kill -9 after the reset went out, before its result: the restarted provisioner is
    handed the command again, its journal says it began, and it ends `unknown`."""
    assert enroll(stack, bmc, "metal-c", credentials(tmp_path)).returncode == 0
    machine = node_of(stack, "metal-c")
    system = MACHINES["metal-c"]["uuid"]
    begun = set(journal_begun(stack))
    stack.json("nodes", "power", machine["id"], "on")
    resets = f"{system}/Actions/ComputerSystem.Reset"
    assert wait_until(lambda: bmc.requests("POST", resets) == 1, 30)
    assert set(journal_begun(stack)) - begun, "the command was not journaled before acting"
    pid = provisioner_pid(stack)
    os.kill(pid, signal.SIGKILL)  # the fake BMC takes 1-11 s to power on: still waiting
    assert wait_until(lambda: provisioner_pid(stack) not in (None, pid), 30)
    assert wait_until(lambda: events(stack, machine["id"], "node.power"), 60)
    result = events(stack, machine["id"], "node.power")[-1]["payload"]
    assert "stopped while running it" in result["error"], result
    assert bmc.requests("POST", resets) == 1  # not run again
    assert wait_until(lambda: bmc.system(system)["PowerState"] == "On", 30)


def test_no_bmc_password_in_logs_events_audit_answers_or_processes(stack, bmc):
    """Run last: after every test above used the password."""
    seen = [stack.cli("nodes", "list", "--output", "json").stdout,
            stack.cli("events", "list", "--output", "json").stdout,
            subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True,
                           check=True).stdout, "".join(stack.output)]
    files = [p for p in stack.state_dir.rglob("*") if p.is_file()]
    seen += [p.read_text(errors="replace") for p in files]
    assert any("metal-a" in text for text in seen)  # the search looks where they are
    assert not [text[:200] for text in seen if PASSWORD in text]
    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        found = conn.execute(
            "SELECT (SELECT count(*) FROM audit_auditevent WHERE data::text LIKE %(pw)s), "
            "(SELECT count(*) FROM compute_event WHERE payload::text LIKE %(pw)s), "
            "(SELECT count(*) FROM fleet_nodecommand WHERE payload::text || signed || "
            "coalesce(result::text, '') LIKE %(pw)s), "
            "(SELECT count(*) FROM audit_auditevent)",
            {"pw": f"%{PASSWORD}%"}).fetchone()
    assert found[:3] == (0, 0, 0)
    assert found[3] > 0
