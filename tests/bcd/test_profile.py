"""The node profile's units on the agent: what each does when its tools are there, are not,
or fail; that the work is journaled and not done again for nothing; the acceptance check.

`nvidia-ctk` cannot be installed here (NVIDIA's repository), so a stand-in executable on
PATH plays it: it writes the spec NVIDIA's tool writes for these GPUs (by UUID) and logs
each call, which is what bcd's side of the unit depends on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bcd.cdi import vendor_spec
from bcd.contract.holds import BadHold
from bcd.profile import NodeProfile
from tests.bcd.test_journal import agent, gpus_of, hold

CTK = """#!/bin/sh
echo "$@" >> "{log}"
[ -f "{fail}" ] && {{ echo "nvidia-ctk: could not load NVML: driver mismatch" >&2; exit 1; }}
out=$(echo "$@" | tr ' ' '\\n' | sed -n 's/^--output=//p')
cat > "$out" <<'JSON'
{spec}
JSON
"""


def fake_ctk(folder: Path, gpus: list[str]) -> tuple[Path, Path]:
    """nvidia-ctk in `folder`: its call log, and the file whose presence makes it fail."""
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": uuid, "containerEdits": {"deviceNodes": [
                {"path": f"/dev/nvidia{i}"}]}} for i, uuid in enumerate(gpus)],
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]}}
    log, fail = folder / "ctk.log", folder / "ctk.fail"
    tool = folder / "nvidia-ctk"
    tool.write_text(CTK.format(log=log, fail=fail, spec=json.dumps(spec)))
    tool.chmod(0o755)
    return log, fail


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """A folder first on PATH, and nothing of Slurm's tools."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    return folder


def profile_of(root: Path) -> NodeProfile:
    return agent(root, []).profile


def test_without_nvidia_ctk_the_toolkit_unit_is_unavailable_and_says_why(root, on_path):
    profile = profile_of(root)
    profile.want(("container-toolkit",), 4)
    state = profile.converge()["container-toolkit"]
    assert (state.state, state.generation) == ("unavailable", 4)
    assert "nvidia-ctk not found" in state.reason
    assert not (root / "etc/cdi/nvidia.json").exists()
    assert profile.report()["units"]["container-toolkit"]["state"] == "unavailable"


def test_the_toolkit_unit_writes_the_vendor_spec_once_and_again_after_a_driver_change(
        root, on_path):
    gpus = gpus_of(root, 8)
    log, _ = fake_ctk(on_path, gpus)
    profile = profile_of(root)
    profile.want(("container-toolkit",), 1)
    state = profile.converge()["container-toolkit"]
    assert state.state == "ready", state.reason
    assert "names 8 devices by UUID" in state.reason
    assert "--device-name-strategy=uuid" in log.read_text()
    vendor = vendor_spec(root)  # what new holds take their device edits from
    assert vendor is not None
    assert vendor.source == str(root / "etc/cdi/nvidia.json")
    assert profile.journal.state("unit", "container-toolkit")["state"] == "ready"
    profile.converge()
    assert len(log.read_text().splitlines()) == 1  # nothing changed: not made again
    driver = root / "sys/module/nvidia/version"
    driver.parent.mkdir(parents=True)
    driver.write_text("550.54.15\n")
    assert "driver 550.54.15" in profile.converge()["container-toolkit"].reason
    assert len(log.read_text().splitlines()) == 2


def test_a_failing_nvidia_ctk_fails_the_unit_with_its_words_and_holds_still_bind(
        root, on_path):
    _, fail = fake_ctk(on_path, gpus_of(root, 8))
    fail.touch()
    instance = agent(root, [])
    reports = instance.apply_spec(1, {"allocations": [hold("alloc_01jfq0000000000000000000aa",
                                                           gpus_of(root, 1))],
                                      "profile": {"units": ["container-toolkit"]}})
    assert [r[0] for r in reports] == ["bound"]
    state = instance.profile.converge()["container-toolkit"]
    assert state.state == "failed"
    assert "driver mismatch" in state.reason
    status, output = instance.profile.check(["container-toolkit"])
    assert status == "failed"
    assert output["error"].startswith("profile: container-toolkit failed: nvidia-ctk")


def test_the_acceptance_check_passes_once_every_required_unit_is_ready(root, on_path):
    fake_ctk(on_path, gpus_of(root, 8))
    status, output = profile_of(root).check(["container-toolkit"])
    assert status == "succeeded"
    assert output["units"]["container-toolkit"]["state"] == "ready"
    status, output = profile_of(root).check(["container-toolkit", "slurmd"])
    assert status == "failed"
    assert "slurmd unavailable: slurmd" in output["error"]
    assert "not found (install Slurm's slurmd and client)" in output["error"]


def test_the_slurmd_unit_without_the_sites_slurm_conf_says_which_file(root, on_path,
                                                                         monkeypatch):
    for tool in ("slurmd", "scontrol", "scancel"):
        (on_path / tool).write_text("#!/bin/sh\nexit 0\n")
        (on_path / tool).chmod(0o755)
    monkeypatch.setenv("SLURM_CONF", str(root / "nowhere/slurm.conf"))
    profile = profile_of(root)
    profile.want(("slurmd",), 2)
    state = profile.converge()["slurmd"]
    assert state.state == "unavailable"
    assert str(root / "nowhere/slurm.conf") in state.reason


@pytest.mark.parametrize("profile", [{"units": ["sshd"]}, {"units": "slurmd"},
                                     {"units": ["slurmd", "slurmd"]}])
def test_a_spec_with_a_malformed_profile_is_refused_whole(root, profile):
    instance = agent(root, [])
    with pytest.raises((BadHold, ValueError)):
        instance.apply_spec(1, {"allocations": [], "profile": profile})
    assert instance.journal.applied_generation() == 0
    assert instance.profile.units == ()


def test_the_report_changes_only_when_the_units_or_their_states_do(root, on_path):
    profile = profile_of(root)
    profile.want(("container-toolkit",), 3)
    profile.converge()
    first = profile.report()
    profile.want(("container-toolkit",), 4)  # a spec that only added or dropped a hold
    profile.converge()
    assert profile.report() == first  # the inventory is not sent again for nothing
    profile.want(("container-toolkit", "slurmd"), 5)
    profile.converge()
    assert profile.report()["generation"] == 5
    assert profile.report()["units"]["container-toolkit"]["generation"] == 5


def test_a_unit_that_cannot_write_its_files_fails_without_taking_the_agent_down(
        root, on_path):
    fake_ctk(on_path, gpus_of(root, 8))
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/cdi").write_text("a file where the CDI folder should be")
    profile = profile_of(root)
    profile.want(("container-toolkit",), 2)
    state = profile.converge()["container-toolkit"]
    assert state.state == "failed"
    assert "FileExistsError" in state.reason or "NotADirectoryError" in state.reason, state
