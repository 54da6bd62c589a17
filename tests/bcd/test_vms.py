"""The agent's side of sandbox VMs without booting one: the spec contract, refusals before
QEMU runs (an image part whose bytes do not match), and a VM released before it started."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from bcd.agent import Agent
from bcd.config import Config, Paths
from bcd.contract import ids
from bcd.contract.crypto import verify_bytes
from bcd.contract.vms import BadVm, Vm
from bcd.vms import vm_states


def vm_entry(tmp_path: Path, **changes: object) -> dict[str, object]:
    part = tmp_path / "part"
    part.write_bytes(b"kernel bytes")
    digest = hashlib.sha256(b"kernel bytes").hexdigest()
    entry: dict[str, object] = {
        "sandboxId": ids.new("sbx"), "vcpus": 2, "memoryMiB": 1024,
        "kernel": {"url": part.as_uri(), "sha256": digest},
        "initrd": {"url": part.as_uri(), "sha256": digest}}
    entry.update(changes)
    return entry


@pytest.mark.parametrize(("change", "said"), [
    ({"sandboxId": "rsv_01jbx0000000000000000000aa"}, "sbx"),
    ({"vcpus": 0}, "vcpus"),
    ({"memoryMiB": True}, "memoryMiB"),
    ({"kernel": {"url": "ftp://x/y", "sha256": "0" * 64}}, "kernel.url"),
    ({"initrd": {"url": "file:///x", "sha256": "ABC"}}, "initrd.sha256"),
    ({"forwards": [{"hostPort": 80, "guestPort": 22}], "network": "outbound"}, "hostPort"),
    ({"forwards": [{"hostPort": 2222, "guestPort": 22}]}, "need network outbound"),
    ({"network": "bridge"}, "network"),
    ({"snapshot": "yes"}, "snapshot"),
    ({"listen": "10.0.0.1"}, "listen"),
    ({"desired": "asleep"}, "desired"),
])
def test_a_malformed_vm_is_refused_naming_what_is_wrong(tmp_path, change, said):
    with pytest.raises(BadVm, match=said):
        Vm.from_wire(vm_entry(tmp_path, **change))


def test_the_wire_form_round_trips(tmp_path):
    vm = Vm.from_wire(vm_entry(tmp_path, forwards=[{"hostPort": 2222, "guestPort": 22}],
                               network="outbound", snapshot=True, desired="paused"))
    assert Vm.from_wire(vm.wire()) == vm


def test_a_spec_with_one_bad_vm_applies_nothing(root, tmp_path):
    agent = Agent(Config.read(Paths(root).config_file))
    with pytest.raises(BadVm):
        agent.apply_spec(1, {"allocations": [], "vms": [vm_entry(tmp_path, vcpus=-1)]})
    assert agent.journal.applied_generation() == 0
    assert agent.vms.wanted is None


def reports_of(root: Path, sent: list[tuple[str, str, str]]) -> list[dict[str, object]]:
    public = (root / "public.pem").read_text()
    assert all(verify_bytes(public, body.encode(), signature) for _, body, signature in sent)
    return [json.loads(body) for _, body, _ in sent]


def keeper_of(root: Path) -> tuple[Agent, list[tuple[str, str, str]]]:
    agent = Agent(Config.read(Paths(root).config_file))
    sent: list[tuple[str, str, str]] = []
    agent.vms.send = sent.extend
    agent.vms.accelerator = "tcg"
    return agent, sent


def test_an_image_part_that_does_not_match_its_hash_fails_before_qemu(root, tmp_path):
    agent, sent = keeper_of(root)
    entry = vm_entry(tmp_path)
    entry["initrd"] = {"url": entry["kernel"]["url"], "sha256": "1" * 64}  # type: ignore[index]
    agent.apply_spec(1, {"allocations": [], "vms": [entry]})
    asyncio.run(agent.vms.converge())
    [report] = reports_of(root, sent)
    assert (report["phase"], report["nodeId"]) == ("failed", "node_x")
    assert str(report["reason"]).startswith("initrd from file://")
    assert str(report["reason"]).endswith("not " + "1" * 64)
    assert not (Paths(root).state_dir / "vms" / str(entry["sandboxId"])).exists()
    cached = list((root / "var/cache/bcd/images").iterdir())
    assert [p.name for p in cached] == [entry["kernel"]["sha256"]]  # type: ignore[index]
    asyncio.run(agent.vms.converge())
    assert len(sent) == 1  # ended: not tried again, not said again until a new session


def test_a_vm_released_before_it_started_is_reported_stopped(root, tmp_path):
    agent, sent = keeper_of(root)
    entry = vm_entry(tmp_path, desired="stopped")
    agent.apply_spec(1, {"allocations": [], "vms": [entry]})
    asyncio.run(agent.vms.converge())
    assert [r["phase"] for r in reports_of(root, sent)] == ["stopped"]
    assert vm_states(agent.journal)[str(entry["sandboxId"])]["state"] == "stopped"
    restarted, again = keeper_of(root)  # a new agent says it again on its next session
    restarted.vms.resend()
    assert [r["phase"] for r in reports_of(root, again)] == ["stopped"]


def test_a_vm_that_ended_says_when_and_says_it_again_after_a_restart(root, tmp_path):
    import time

    from bcd import qemu

    agent, sent = keeper_of(root)
    sandbox = ids.new("sbx")
    agent.journal.begin("vm-start", sandbox, vm=vm_entry(tmp_path, sandboxId=sandbox),
                        at=time.time())
    before = time.time()
    agent.vms._end(sandbox, qemu.VmFiles.of(agent.vms.paths, sandbox), "exited",
                   "the guest halted", 0)
    [report] = reports_of(root, sent)
    assert report["phase"] == "exited"
    assert before - 0.001 <= report["endedAt"] <= time.time()  # the node's clock, signed
    restarted, again = keeper_of(root)
    restarted.vms.resend()  # the journal still knows when
    assert [r["endedAt"] for r in reports_of(root, again)] == [report["endedAt"]]
