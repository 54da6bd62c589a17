"""Bare metal against a real Redfish service: sushy-tools' emulator (fake driver) on a
loopback port, enrolled through `dev`'s provisioner (a real `bcd node --provisioner`)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid

import httpx
import psycopg
import pytest

from tests.e2e.conftest import start_stack, stop_stack
from tests.support.redfish import USERNAME, Emulator, served
from tests.support.waiting import wait_until

PASSWORD = f"bmc-{uuid.uuid4().hex[:12]}-pw"
MACHINES = {name: {"uuid": str(uuid.uuid4()), "name": name, "power_state": "Off",
                   "nics": [{"mac": f"52:54:00:aa:bb:{n:02x}", "ip": f"10.0.0.{n}"}]}
            for n, name in enumerate(["metal-a", "metal-b", "metal-c", "metal-d"], start=1)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = start_stack(tmp_path_factory.mktemp("metal"), "--sim", "0",
                          env_extra={"BETTER_COMPUTE_BMC_POLL_SECONDS": "3"})
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
        # `bcd node --provisioner`, or `bcd join --run --provisioner` (its first start)
        if f"--root {root} " in line and "-m bcd" in line and "--provisioner" in line:
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


def deployed_os_uuid(hostname: str) -> str:
    """The product UUID the simulated machine `hostname` reports (as DMI spells it), so the
    BMC's system and the OS that joins are one machine."""
    from bcd.inventory.fake import SimulatedInventory

    raw = SimulatedInventory(hostname).host()["productUuid"]
    return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:32]}"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """The images, over HTTP: the BMC downloads the deploy ISO it inserts."""
    root = tmp_path_factory.mktemp("media")
    (root / "deploy.iso").write_bytes(b"\0" * 65536)
    (root / "os.raw").write_bytes(b"\1" * 65536)
    with served(root) as url:
        yield url, root


def image(stack, media, name, disk):
    url, root = media
    digest = hashlib.sha256((root / disk).read_bytes()).hexdigest()
    stack.ok("images", "create", "--pool", stack.env["POOL"], "--name", name,
             "--kernel", f"{url}/{disk}", "--kernel-sha256", digest, "--initrd",
             f"{url}/{disk}", "--initrd-sha256", digest, "--disk", f"{url}/{disk}",
             "--disk-sha256", digest)


def test_a_deploy_boots_the_ramdisk_and_the_os_it_writes_joins_as_the_node(
        stack, media, tmp_path_factory, tmp_path):
    """The emulator shows the ISO in the virtual CD, the next boot set to it and the power
    on; the ramdisk's lookup at the provisioner gets the image and a join token once; the
    OS's agent (a simulated machine with this UUID) joins with it as the same node, passes
    acceptance and is adopted. Undeploy ejects the media and powers off."""
    name = "metal-os"
    system = {"uuid": deployed_os_uuid(name), "name": name, "power_state": "Off",
              "nics": [{"mac": "52:54:00:aa:cc:01", "ip": "10.0.0.21"}]}
    MACHINES[name] = system
    emulator = Emulator(tmp_path_factory.mktemp("deploy-bmc"), PASSWORD, [system]).start()
    try:
        image(stack, media, "os", "os.raw")
        image(stack, media, "deploy", "deploy.iso")
        assert enroll(stack, emulator, name, credentials(tmp_path)).returncode == 0
        machine = node_of(stack, name)["id"]
        deploying = stack.json("nodes", "deploy", machine, "--image", "os", "--ramdisk",
                               "deploy", "--timeout", "10m")
        assert deploying["provisionState"] == "deploying"
        cd = f"/redfish/v1/Systems/{system['uuid']}/VirtualMedia/Cd"
        assert wait_until(lambda: emulator.system(system["uuid"])["PowerState"] == "On", 60)
        # (the emulator keeps every override Continuous, whatever was asked)
        assert emulator.system(system["uuid"])["Boot"]["BootSourceOverrideTarget"] == "Cd"
        drive = emulator.get(cd)
        assert (drive["Inserted"], drive["Image"]) == (True, f"{media[0]}/deploy.iso")
        lookup = f"{stack.env['DEPLOY_URL']}?serial=&productUuid={system['uuid']}"
        assert httpx.get(f"{stack.env['DEPLOY_URL']}?productUuid={uuid.uuid4()}").status_code \
            == 404
        instructions = httpx.get(lookup, timeout=10).json()
        assert instructions["image"]["url"] == f"{media[0]}/os.raw"
        assert httpx.get(lookup, timeout=10).status_code == 404  # handed out once
        join = instructions["join"]
        root = tmp_path / "deployed-os"
        token_file = tmp_path / "token"
        token_file.write_text(join["token"])
        token_file.chmod(0o600)
        joined = subprocess.run(
            [sys.executable, "-m", "bcd", "--root", str(root), "join", "--server",
             join["server"], "--serving-ca-pin", join["servingCaPin"], "--join-signing-pin",
             join["joinSigningPin"], "--join-encryption-pin", join["joinEncryptionPin"],
             "--token-file", str(token_file), "--sim", "--hostname", name],
            capture_output=True, text=True, timeout=60, check=False)
        assert joined.returncode == 0, joined.stderr
        assert f"joined as {machine}" in joined.stdout
        agent = subprocess.Popen([sys.executable, "-m", "bcd", "--root", str(root), "node"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert wait_until(lambda: stack.json("nodes", "get", machine)["provisionState"]
                              == "adopted", 120)
            adopted = stack.json("nodes", "get", machine)
            assert adopted["schedulable"]
            states = [e["payload"]["to"] for e in events(stack, machine,
                                                         "node.provision_state")]
            assert states[-2:] == ["deploying", "deployed"]
        finally:
            agent.terminate()
            agent.wait(timeout=30)
        stack.json("nodes", "cordon", machine)
        undeployed = stack.cli("nodes", "undeploy", machine, "--reason", "done", "--wait",
                               "--output", "json", timeout=180)
        assert undeployed.returncode == 0, undeployed.stderr
        assert json.loads(undeployed.stdout)["provisionState"] == "available"
        assert emulator.system(system["uuid"])["PowerState"] == "Off"
        assert emulator.get(cd)["Inserted"] is False
        assert emulator.system(system["uuid"])["Boot"]["BootSourceOverrideTarget"] == "Hdd"
    finally:
        emulator.stop()


def test_a_bmc_gone_mid_deploy_marks_the_node_and_changes_nothing_else(
        stack, media, tmp_path_factory, tmp_path):
    name = "metal-gone"
    system = {"uuid": str(uuid.uuid4()), "name": name, "power_state": "Off",
              "nics": [{"mac": "52:54:00:aa:cc:02", "ip": "10.0.0.22"}]}
    MACHINES[name] = system
    emulator = Emulator(tmp_path_factory.mktemp("gone-bmc"), PASSWORD, [system]).start()
    try:
        if not [i for i in stack.json("images", "list", "--pool", stack.env["POOL"])["items"]
                if i["name"] == "deploy"]:
            image(stack, media, "os", "os.raw")
            image(stack, media, "deploy", "deploy.iso")
        assert enroll(stack, emulator, name, credentials(tmp_path)).returncode == 0
        machine = node_of(stack, name)["id"]
        stack.json("nodes", "deploy", machine, "--image", "os", "--ramdisk", "deploy")
        assert wait_until(lambda: stack.json("nodes", "get", machine)["bmc"]["deployment"][
            "bootedAt"], 60)  # booting the ramdisk, waiting for its OS to join
        emulator.stop()
        assert wait_until(lambda: stack.json("nodes", "get", machine)["bmc"]["reachable"]
                          is False, 60)  # the poll found it gone
        after = stack.json("nodes", "get", machine)
        assert after["provisionState"] == "deploying"  # nothing failed, released or retired
        assert len(events(stack, machine, "node.bmc.unreachable")) == 1
    finally:
        emulator.stop()


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
