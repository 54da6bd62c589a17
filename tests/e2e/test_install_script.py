"""The agent's artifacts and the generated installer. `daemon artifact` builds the wheel
(Python 3.10 or newer, bcd alone) and a single-file executable with PyInstaller, which runs
without the control plane; the installer is valid POSIX sh, and on a fake root it downloads
that executable from the API's downloads, verifies the pinned digest, writes the config,
joins (checking the token's site) and writes the unit."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import zipfile

import httpx
import pytest

from bcd.contract.version import version
from tests.e2e.conftest import start_stack, stop_stack

VERSION = version()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = start_stack(tmp_path_factory.mktemp("install"))  # serves downloads by default
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def built(stack, agent_artifacts):
    """`daemon artifact`'s wheel and executable, in the stack's downloads folder."""
    downloads = stack.state_dir / "downloads"
    downloads.mkdir(exist_ok=True)
    for name in agent_artifacts.digests:
        shutil.copy2(agent_artifacts.folder / name, downloads / name)
    return agent_artifacts.digests


@pytest.fixture(scope="module")
def artifact(stack, built):
    """The executable, as any client downloads it from the API, and its SHA-256."""
    name = f"bcd_{VERSION}_linux_amd64"
    url = stack.env["BETTER_COMPUTE_URL"].removesuffix("/api/compute")
    response = httpx.get(f"{url}/downloads/{name}", timeout=60)
    assert response.status_code == 200
    digest = hashlib.sha256(response.content).hexdigest()
    assert built[name] == digest
    return response.content, digest


def make_script(stack, tmp_path, digest, site=None):
    base = stack.env["BETTER_COMPUTE_URL"].removesuffix("/api/compute")
    script = tmp_path / "install-bcd.sh"
    stack.ok("daemon", "install-script", "--pool", stack.env["POOL"], "--site",
             site or stack.env["SITE"], "--gateway-url", "grpcs://gw.example.com:8443",
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
    installed = root / "usr/local/bin/bcd"
    assert installed.read_bytes() == artifact[0]  # the executable itself
    assert installed.read_bytes()[:4] == b"\x7fELF"
    assert not (root / "opt").exists()  # no Python packages, no control plane on the node
    # The control plane publishes its gateway, so the installer's pin is reported, not used.
    assert "warning: the control plane publishes the gateway" in result.stderr
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


def test_a_token_for_another_site_is_refused_before_anything_is_written(stack, artifact,
                                                                        tmp_path):
    token = stack.ok("join-tokens", "create", "--pool", stack.env["POOL"], "--ttl", "1h",
                     "--query", "token")
    script = make_script(stack, tmp_path, artifact[1], site="site_01jbx0000000000000000000zz")
    root = tmp_path / "root"
    env = {"PATH": os.environ["PATH"], "BCD_ROOT": str(root), "BCD_SIM": "1",
           "HOME": str(tmp_path)}
    result = subprocess.run(["sh", str(script)], input=token + "\n", capture_output=True,
                            text=True, timeout=300, env=env, check=False)
    assert result.returncode == 1
    assert f"this token's pool is in site {stack.env['SITE']}" in result.stderr
    assert not (root / "etc/bcd/config.toml").read_text().count("node_id")
    assert not (root / "etc/systemd/system/bcd.service").exists()


def test_the_executable_runs_without_python_packages(artifact, tmp_path):
    binary = tmp_path / "bcd"
    binary.write_bytes(artifact[0])
    binary.chmod(0o755)
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no virtualenv, no PYTHONPATH
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                             env=bare, timeout=120, check=True)
    assert version.stdout.strip() == f"bcd {VERSION}"
    helped = subprocess.run([str(binary), "--root", str(tmp_path / "r"), "join", "--help"],
                            capture_output=True, text=True, env=bare, timeout=120, check=True)
    assert "--serving-ca-pin" in helped.stdout
    assert "--expect-site" in helped.stdout
    from PyInstaller.archive.readers import CArchiveReader

    modules = {name.split(".")[0]
               for name in CArchiveReader(str(binary)).open_embedded_archive("PYZ.pyz").toc}
    assert {"bcd", "grpc", "cryptography"} <= modules
    assert not modules & {"django", "compute", "fleet", "reservations", "audit", "gateway",
                          "rest_framework", "psycopg"}


def test_the_wheel_is_the_agent_alone_for_python_3_10_and_newer(stack, built):
    name = f"better_compute_agent-{VERSION}-py3-none-any.whl"
    data = (stack.state_dir / "downloads" / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == built[name]
    archive = zipfile.ZipFile(io.BytesIO(data))
    names = archive.namelist()
    assert {n.split("/")[0] for n in names} == {"bcd", f"better_compute_agent-{VERSION}.dist-info"}
    metadata = archive.read(f"better_compute_agent-{VERSION}.dist-info/METADATA").decode()
    assert "Requires-Python: >=3.10" in metadata
    assert 'Requires-Dist: nvidia-ml-py>=12; extra == "nvml"' in metadata
    assert len(data) < 1_000_000  # tens of kB, not the whole control plane
