"""The generated installer: valid POSIX sh, and on a fake root it downloads bcd from the
API's downloads, verifies the pinned digest, writes the config, joins and writes the unit."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from tests.e2e.conftest import start_stack, stop_stack

VERSION = "0.1.0"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """This package as a wheel, under the goreleaser-style name the script fetches."""
    out = tmp_path_factory.mktemp("wheel")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(out), repo], check=True, timeout=300)
    wheel = next(out.glob("better_compute-*.whl"))
    downloads = tmp_path_factory.mktemp("downloads")
    target = downloads / f"bcd_{VERSION}_linux_amd64"
    shutil.copy(wheel, target)
    return downloads, hashlib.sha256(target.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, artifact):
    downloads, _ = artifact
    running = start_stack(tmp_path_factory.mktemp("install"),
                          env_extra={"BETTER_COMPUTE_DOWNLOADS_DIR": str(downloads)})
    yield running
    stop_stack(running)


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
