"""The bcd command against the dev stack: join refusals, status, doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from tests.support.workloads import holding


def bcd(*args, env=None, stdin=None):
    return subprocess.run([sys.executable, "-m", "bcd", *args], capture_output=True, text=True,
                          timeout=60, check=False, env=env, input=stdin)


@pytest.fixture(scope="module")
def pins(stack):
    shown = json.loads(stack.ok("api", "pki.show", "-o", "json"))
    return ["--serving-ca-pin", shown["servingCaSpkiPin"],
            "--join-signing-pin", shown["joinSigningKeyPin"],
            "--join-encryption-pin", shown["joinEncryptionKeyPin"]]


def mint(stack, uses=1):
    return json.loads(stack.ok("api", "joinTokens.create", f"poolId={stack.env['POOL']}",
                               "ttl=3600000", f"maxUses={uses}", "-o", "json"))


def join_args(stack, root, pins, *extra):
    return ["--root", str(root), "join", "--server", stack.env["BETTER_COMPUTE_URL"], *pins,
            "--sim", "--hostname", "gpu-test", *extra]


def uses_of(stack, token_id):
    items = json.loads(stack.ok("api", "joinTokens.list", "-o", "json"))["items"]
    return next(t["uses"] for t in items if t["id"] == token_id)


def test_join_with_a_private_token_file_then_a_second_join_spends_nothing(stack, pins, tmp_path):
    minted = mint(stack)
    token_file = tmp_path / "join-token"
    token_file.write_text(minted["token"])
    token_file.chmod(0o600)
    first = bcd(*join_args(stack, tmp_path / "root", pins, "--token-file", str(token_file)))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("joined as node_")
    assert "(site site_" in first.stdout
    assert "role node); certificate valid until" in first.stdout
    assert not token_file.exists()  # deleted after the join
    config = tmp_path / "root" / "etc" / "bcd"
    for name in ("config.toml", "node-key.pem", "node-cert.pem"):
        assert oct((config / name).stat().st_mode & 0o777) == "0o600"
    second = bcd(*join_args(stack, tmp_path / "root", pins),
                 env={**os.environ, "BCD_JOIN_TOKEN": minted["token"]})
    assert second.returncode == 0
    assert second.stdout.startswith("already joined as node_")
    assert uses_of(stack, minted["id"]) == 1


def test_join_refuses_a_pin_mismatch(stack, pins, tmp_path):
    minted = mint(stack)
    wrong = [*pins[:-1], "sha256/" + "A" * 43 + "="]
    result = bcd(*join_args(stack, tmp_path / "root", wrong),
                 env={**os.environ, "BCD_JOIN_TOKEN": minted["token"]})
    assert result.returncode == 1
    assert "joinEncryptionKeyPin" in result.stderr
    assert uses_of(stack, minted["id"]) == 0
    assert not (tmp_path / "root" / "etc" / "bcd" / "config.toml").exists()


def test_join_refuses_a_token_file_others_can_read(stack, pins, tmp_path):
    minted = mint(stack)
    token_file = tmp_path / "join-token"
    token_file.write_text(minted["token"])
    token_file.chmod(0o644)
    result = bcd(*join_args(stack, tmp_path / "root", pins, "--token-file", str(token_file)))
    assert result.returncode == 1
    assert "readable by others" in result.stderr
    assert token_file.exists()
    assert uses_of(stack, minted["id"]) == 0


def test_join_refuses_the_token_as_an_argument(stack, pins, tmp_path):
    minted = mint(stack)
    result = bcd(*join_args(stack, tmp_path / "root", pins), minted["token"])
    assert result.returncode == 2
    assert "never one" in result.stderr
    assert minted["token"] not in result.stderr  # not even echoed back whole
    assert uses_of(stack, minted["id"]) == 0


def test_join_reads_the_token_from_standard_input(stack, pins, tmp_path):
    minted = mint(stack)
    result = bcd(*join_args(stack, tmp_path / "root", pins), stdin=minted["token"] + "\n",
                 env={k: v for k, v in os.environ.items() if k != "BCD_JOIN_TOKEN"})
    assert result.returncode == 0, result.stderr
    assert uses_of(stack, minted["id"]) == 1


def test_status_json_and_text_of_a_running_simulated_agent(stack, tmp_path_factory):
    root = next(p for p in (stack.state_dir / "sim").iterdir())
    result = bcd("--root", str(root), "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["session"]["connected"] is True
    assert status["session"]["epoch"] >= 1
    assert len(status["gpus"]) == 8
    assert status["nodeId"].startswith("node_")
    node = json.loads(stack.ok("nodes", "get", status["nodeId"], "-o", "json"))
    assert sorted(g["uuid"] for g in status["gpus"]) == sorted(d["uuid"] for d in node["devices"])
    text = bcd("--root", str(root), "status").stdout
    assert f"connected (epoch {status['session']['epoch']})" in text
    assert text.count("\ngpu ") == 8


def test_status_without_an_agent_is_a_clear_error(tmp_path):
    result = bcd("--root", str(tmp_path), "status")
    assert result.returncode == 1
    assert "cannot reach the agent" in result.stderr


def test_doctor_passes_on_a_joined_simulated_agent_and_fails_on_loose_permissions(stack):
    root = next(p for p in (stack.state_dir / "sim").iterdir())
    ok = bcd("--root", str(root), "doctor")
    assert ok.returncode == 0, ok.stdout
    assert "pass  pins" in ok.stdout
    key = root / "etc" / "bcd" / "node-key.pem"
    key.chmod(0o644)
    try:
        bad = bcd("--root", str(root), "doctor")
    finally:
        key.chmod(0o600)
    assert bad.returncode == 1
    assert "FAIL  permissions" in bad.stdout


def held_device(stack, rsv) -> tuple[Path, Path]:
    """The sim root of the reservation's node and the device file of its one GPU there."""
    env_file = Path(rsv["binding"]["envFile"])
    root = env_file.parents[3]  # <root>/run/bcd/allocations/<alloc>.env
    [uuid] = [d.split("=", 1)[1] for d in rsv["binding"]["cdiDevices"]]
    status = json.loads(bcd("--root", str(root), "status", "--json").stdout)
    [index] = [g["index"] for g in status["gpus"] if g["uuid"] == uuid]
    return root, root / f"dev/nvidia{index}"


def released_event(stack, allocation_id: str) -> dict:
    def found() -> dict | None:
        items = json.loads(stack.ok("api", "events.list", "types=allocation.released",
                                    "-o", "json"))["items"]
        return next((e for e in items if e["subject"] == allocation_id), None)

    assert wait_until(found, 60), "no allocation.released"
    event = found()
    assert event is not None
    return event


def test_at_its_end_a_fenced_hold_is_noticed_then_its_workload_stopped_and_named(
        stack, tmp_path):
    stack.add_to_policy(tmp_path, onEnd="fence", fenceGraceSeconds=2, endingNotices=[14, 5])
    try:
        rsv = json.loads(stack.ok("reserve", "--pool", stack.env["POOL"], "--gpus", "1",
                                  "--for", "20s", "-o", "json"))
        assert rsv["state"] == "active", rsv
        root, device = held_device(stack, rsv)
        workload = holding(device)
        ending = root / f"run/bcd/allocations/{rsv['allocationId']}.ending"
        seen = []

        def noticed(seconds: float) -> bool:
            if ending.exists():
                notice = json.loads(ending.read_text())
                seen.append(notice["noticeSeconds"])
                return notice["noticeSeconds"] == seconds
            return False

        assert wait_until(lambda: noticed(14), 20)
        status = json.loads(bcd("--root", str(root), "status", "--json").stdout)
        [held] = [h for h in status["holds"] if h["allocationId"] == rsv["allocationId"]]
        assert (held["onEnd"], held["endingNotice"]) == ("fence", 14)
        assert wait_until(lambda: noticed(5), 20)
        event = released_event(stack, rsv["allocationId"])  # at the end, by itself
        assert workload.wait(timeout=10) is not None
        [stopped] = event["payload"]["workloads"]["stopped"]
        assert (stopped["pid"], stopped["signal"]) == (workload.pid, "SIGTERM")
        assert stopped["why"] == f"device /dev/{device.name}"
        assert not ending.exists()
    finally:
        stack.add_to_policy(tmp_path, onEnd="notify")


def test_a_notify_pools_release_leaves_the_workload_running_and_says_so(stack):
    rsv = json.loads(stack.ok("reserve", "--pool", stack.env["POOL"], "--gpus", "1",
                              "--for", "1h", "-o", "json"))
    _, device = held_device(stack, rsv)
    workload = holding(device)
    try:
        stack.ok("release", rsv["id"])
        event = released_event(stack, rsv["allocationId"])
        assert [w["pid"] for w in event["payload"]["workloads"]["running"]] == [workload.pid]
        assert workload.poll() is None
    finally:
        workload.kill()
        workload.wait()
