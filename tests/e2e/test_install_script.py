"""The generated installer: valid POSIX sh, and on a fake root it downloads bcd from the
API's downloads, verifies the pinned digest, writes the config, joins and writes the unit."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import zipfile

import httpx
import pytest

from tests.e2e.conftest import start_stack, stop_stack

VERSION = "0.1.0"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = start_stack(tmp_path_factory.mktemp("install"))  # serves downloads by default
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def artifact(stack):
    """The agent artifact dev serves, as any client downloads it, and its SHA-256."""
    url = stack.env["BETTER_COMPUTE_URL"].removesuffix("/api/compute")
    response = httpx.get(f"{url}/downloads/bcd_{VERSION}_linux_amd64", timeout=30)
    assert response.status_code == 200  # no variable to set first, no renaming by hand
    printed = "".join(stack.output)
    digest = hashlib.sha256(response.content).hexdigest()
    assert f"bcd_{VERSION}_linux_amd64 sha256 {digest}" in printed
    return response.content, digest


def make_script(stack, tmp_path, digest):
    base = stack.env["BETTER_COMPUTE_URL"].removesuffix("/api/compute")
    script = tmp_path / "install-bcd.sh"
    stack.ok("daemon", "install-script", "--pool", stack.env["POOL"], "--site",
             stack.env["SITE"], "--gateway-url", "grpcs://gw.example.com:8443",
             "--base-url", base, "--bcd-version", VERSION, "--sha256", f"amd64={digest}",
             "--out", str(script))
    return script


def test_the_script_is_valid_posix_shell(stack, artifact, tmp_path):
    script = make_script(stack, tmp_path, artifact[1])
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    assert shutil.which("shellcheck"), "shellcheck is missing: .ci/run installs it"
    checked = subprocess.run(["shellcheck", "-s", "sh", str(script)], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0, checked.stdout
    text = script.read_text()
    assert artifact[1] in text
    assert stack.ok("pki", "show", "--query", "joinSigningKeyPin") in text


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the test artifact is amd64")
def test_the_script_installs_verifies_and_joins_on_a_fake_root(stack, artifact, tmp_path):
    token = stack.ok("join-tokens", "create", "--pool", stack.env["POOL"], "--ttl", "1h",
                     "--query", "token")
    script = make_script(stack, tmp_path, artifact[1])
    root = tmp_path / "root"
    env = {"PATH": os.environ["PATH"], "BCD_ROOT": str(root), "BCD_SIM": "1",
           "BCD_OFFLINE": "1", "HOME": str(tmp_path)}
    result = subprocess.run(["sh", str(script)], input=token + "\n", capture_output=True,
                            text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert "joined as node_" in result.stdout
    assert (root / "usr/local/bin/bcd").exists()
    installed = {p.name for p in (root / "opt/bcd/lib").iterdir()}
    assert "bcd" in installed  # the agent alone: no control plane on the node
    assert not installed & {"compute", "fleet", "reservations", "audit", "gateway", "django"}
    assert "pass  nvidia-smi: skipped: a simulated machine" in result.stdout
    config = (root / "etc/bcd/config.toml").read_text()
    assert 'node_id = "node_' in config
    assert "ExecStart=" in (root / "etc/systemd/system/bcd.service").read_text()
    nodes = stack.ok("nodes", "list", "--pool", stack.env["POOL"], "-o", "json")
    assert '"provisionState": "adopting"' in nodes


def test_a_tampered_artifact_is_refused(stack, artifact, tmp_path):
    script = make_script(stack, tmp_path, "0" * 64)
    env = {"PATH": os.environ["PATH"], "BCD_ROOT": str(tmp_path / "root"), "BCD_SIM": "1",
           "BCD_OFFLINE": "1", "HOME": str(tmp_path)}
    result = subprocess.run(["sh", str(script)], input="bcjt_x.y\n", capture_output=True,
                            text=True, timeout=120, env=env, check=False)
    assert result.returncode == 1
    assert "does not match its pinned SHA-256" in result.stderr
    assert not (tmp_path / "root/usr/local/bin/bcd").exists()


def test_the_artifact_is_the_agent_alone(artifact):
    data, _ = artifact
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert {n.split("/")[0] for n in names} == {"bcd", f"better_compute_agent-{VERSION}.dist-info"}
    assert len(data) < 1_000_000  # tens of kB, not the whole control plane
