"""CDI holds that work in a container: for the held GPUs only, the vendor's per-device edits
plus its top-level edits (control devices, driver libraries, the ldcache hook), read from
nvidia-ctk's JSON or YAML in /etc/cdi or /var/run/cdi; every spec bcd writes passes the CDI
schema; a malformed vendor spec refuses the hold, which is never reported bound."""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from bcd.cdi import BadCdiSpec, check_spec, minimum_version, read_spec_file
from bcd.config import Paths
from bcd.contract import ids
from bcd.contract.holds import Hold
from bcd.holds import FALLBACK, cdi_spec
from tests.bcd.test_journal import agent, gpus_of, hold

FIXTURES = Path(__file__).parent / "fixtures" / "cdi"
UUID_JSON = FIXTURES / "nvidia-ctk-h100x8-uuid.json"
INDEX_YAML = FIXTURES / "nvidia-ctk-h100x8-index.yaml"
VENDOR_UUIDS = [d["name"] for d in json.loads(UUID_JSON.read_text())["devices"][:8]]
INDEX = {uuid: i for i, uuid in enumerate(VENDOR_UUIDS)}


def a_hold(gpus: list[str]) -> Hold:
    return Hold.from_wire({"allocationId": ids.new("alloc"), "reservationId": ids.new("rsv"),
                           "gpus": gpus, "kubernetes": False})


def install(root: Path, fixture: Path, folder: str = "etc/cdi", name: str = "") -> Path:
    target = root / folder / (name or fixture.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(fixture, target)
    return target


@pytest.mark.parametrize(("fixture", "folder"), [(UUID_JSON, "etc/cdi"),
                                                 (INDEX_YAML, "var/run/cdi")])
def test_a_hold_on_four_of_eight_gpus_carries_exactly_their_edits_and_the_vendors(
        tmp_path, fixture, folder):
    install(tmp_path, fixture, folder)
    held = [VENDOR_UUIDS[i] for i in (1, 3, 4, 6)]
    hold = a_hold(held)
    spec, source = cdi_spec(hold, Paths(tmp_path), INDEX)
    check_spec(spec)  # the CDI schema
    assert source.endswith(fixture.name)
    assert [d["name"] for d in spec["devices"]] == held
    nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    assert [n for n in nodes if n.startswith("/dev/nvidia")] == [
        "/dev/nvidia1", "/dev/nvidia3", "/dev/nvidia4", "/dev/nvidia6"]
    text = json.dumps(spec)
    for other in (0, 2, 5, 7):  # nothing of the GPUs the hold does not own
        assert f'"/dev/nvidia{other}"' not in text
        assert f"renderD{128 + other}" not in text
    top = spec["containerEdits"]
    assert {n["path"] for n in top["deviceNodes"]} == {
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
    assert any("libcuda.so" in m["hostPath"] for m in top["mounts"])
    assert any("update-ldcache" in h["args"] for h in top["hooks"])
    assert f"BCD_ALLOCATION_ID={hold.allocation_id}" in top["env"]
    assert f"BCD_PREEMPT_NOTICE={hold.notice_file}" in top["env"]


def test_the_runtime_directory_overrides_etc_cdi(tmp_path):
    install(tmp_path, UUID_JSON, "etc/cdi")
    newer = install(tmp_path, INDEX_YAML, "var/run/cdi", "nvidia.yaml")
    _, source = cdi_spec(a_hold(VENDOR_UUIDS[:1]), Paths(tmp_path), INDEX)
    assert source == str(newer)


def test_without_a_vendor_spec_the_hold_falls_back_and_says_so(tmp_path):
    for minor, node in enumerate(("dev/nvidia2", "dev/nvidiactl", "dev/nvidia-uvm")):
        (tmp_path / node).parent.mkdir(parents=True, exist_ok=True)
        os.mknod(tmp_path / node, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    (tmp_path / "dev/nvidia3").touch()  # a plain file (a simulated GPU's) is no device node
    spec, source = cdi_spec(a_hold(VENDOR_UUIDS[2:4]), Paths(tmp_path), INDEX)
    check_spec(spec)
    assert source == FALLBACK
    # Under a root other than / (a simulated machine), the host path is the file under it.
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia2", "hostPath": str(tmp_path / "dev/nvidia2")}]
    assert spec["devices"][1]["containerEdits"] == {"env": [f"BCD_GPU={VENDOR_UUIDS[3]}"]}
    assert {n["path"] for n in spec["containerEdits"]["deviceNodes"]} == {
        "/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert spec["cdiVersion"] == "0.5.0"  # hostPath came in 0.5.0; Podman 4.3 reads no newer
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(VENDOR_UUIDS[2:4])}" in spec["containerEdits"][
        "env"]


def test_a_vendor_spec_without_a_held_gpu_refuses_the_hold(tmp_path):
    install(tmp_path, UUID_JSON)
    with pytest.raises(BadCdiSpec, match="has no device GPU-ffff"):
        cdi_spec(a_hold(["GPU-ffff0000-0000-0000-0000-000000000000"]), Paths(tmp_path), {})


VALID = json.loads(UUID_JSON.read_text())


def broken(edit) -> dict:
    spec = copy.deepcopy(VALID)
    edit(spec)
    return spec


@pytest.mark.parametrize(("spec", "reason"), [
    (broken(lambda s: s.update(cdiVersion="0.9.9")), "cdiVersion"),
    (broken(lambda s: s.update(kind="gpu")), "kind"),
    (broken(lambda s: s.pop("devices")), "devices: required"),
    (broken(lambda s: s.update(extra=1)), "unknown field extra"),
    (broken(lambda s: s["devices"][0].pop("containerEdits")), "devices[0]"),
    (broken(lambda s: s["devices"][2].update(name=s["devices"][0]["name"])), "appears twice"),
    (broken(lambda s: s["containerEdits"]["deviceNodes"].append({"hostPath": "/dev/x"})),
     "containerEdits.deviceNodes[4].path: required"),
    (broken(lambda s: s["containerEdits"]["mounts"][0].pop("containerPath")),
     "containerEdits.mounts[0].containerPath: required"),
    (broken(lambda s: s["containerEdits"]["hooks"][0].update(timeout=-1)), "uint32"),
    (broken(lambda s: s["containerEdits"]["hooks"][0].pop("path")), "hooks[0].path"),
    (broken(lambda s: s["containerEdits"].update(env="A=1")), "env: must be a list"),
    (broken(lambda s: s["containerEdits"].update(sysctl={})), "unknown field sysctl"),
])
def test_the_schema_check_names_what_is_wrong(spec, reason):
    with pytest.raises(BadCdiSpec, match=reason.replace("[", r"\[").replace("]", r"\]")):
        check_spec(spec)


def test_both_nvidia_ctk_fixtures_pass_the_schema():
    for fixture in (UUID_JSON, INDEX_YAML):
        assert read_spec_file(fixture)["kind"] == "nvidia.com/gpu"


def test_a_malformed_vendor_spec_refuses_the_hold_and_nothing_is_reported_bound(root):
    spec = yaml.safe_load(INDEX_YAML.read_text())
    del spec["containerEdits"]["deviceNodes"][0]["path"]
    (root / "var/run/cdi").mkdir(parents=True)
    (root / "var/run/cdi/nvidia.yaml").write_text(yaml.safe_dump(spec))
    node = agent(root, [])
    allocation = ids.new("alloc")
    reports = node.apply_spec(1, {"allocations": [hold(allocation, gpus_of(root, 2))]})
    assert [kind for kind, _, _ in reports] == ["failed"]
    reason = json.loads(reports[0][1])["reason"]
    assert reason.startswith("cdi: ")
    assert "deviceNodes[0].path: required" in reason
    assert node.held() == {}
    assert not list((root / "etc/cdi").glob("bcd-*"))
    assert not (root / f"run/bcd/allocations/{allocation}.env").exists()


@pytest.mark.parametrize(("edit", "version"), [
    (lambda s: None, "0.3.0"),
    (lambda s: s["devices"][0]["containerEdits"].update(
        mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]), "0.4.0"),
    (lambda s: s["devices"][0]["containerEdits"].update(
        deviceNodes=[{"path": "/dev/x", "hostPath": "/r/dev/x"}]), "0.5.0"),
    (lambda s: s["devices"][0].update(name="0"), "0.5.0"),
    (lambda s: s.update(annotations={"a": "b"}), "0.6.0"),
    (lambda s: s.update(kind="vendor.com/gpu.x"), "0.6.0"),
    (lambda s: s["containerEdits"].update(additionalGids=[44]), "0.7.0"),
])
def test_a_spec_claims_the_oldest_cdi_version_with_what_it_uses(edit, version):
    spec = {"kind": "bcd.dev/gpu", "devices": [
        {"name": "GPU-a", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
        "containerEdits": {"env": ["A=1"]}}
    edit(spec)
    assert minimum_version(spec) == version
