"""The tutorial, command by command, with the real CLI against `dev --memory --sim 2`."""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from tests.support.waiting import wait_until

POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}


def test_dev_prints_where_it_listens_and_adopts_the_simulated_nodes(stack):
    text = "".join(stack.output)
    assert "better-compute listening on http://127.0.0.1:" in text
    assert "2 simulated node(s) adopted and connected" in text
    assert stack.env["BETTER_COMPUTE_URL"].endswith("/api/compute")
    assert stack.env["BETTER_COMPUTE_TOKEN"].startswith("biam_")


def test_tutorial_flow(stack, tmp_path):
    assert stack.ok("api", "system.whoami", "--query", "tenant") == "root"
    site = stack.ok("sites", "create", "--kind", "shared", "--region", "eu-1", "--key",
                    "site-eu-1", "--query", "id")
    assert site.startswith("site_")
    assert stack.ok("sites", "create", "--kind", "shared", "--region", "eu-1", "--key",
                    "site-eu-1", "--query", "id") == site
    (tmp_path / "pool-policy.json").write_text(json.dumps(POLICY))
    pool = stack.ok("pools", "create", "--site", site, "--class", "metal-host", "--gpu-model",
                    "H100", "--policy-file", "pool-policy.json", "--key", "pool-eu-1-h100",
                    "--query", "id", cwd=tmp_path)
    assert stack.ok("pools", "get", pool, "--query", "policy.expect.gpuCount") == "8"
    stack.ok("tenants", "create", "--slug", "acme")
    offered = json.loads(stack.ok("pools", "offer", pool, "--to", "acme", "--quota", "gpu=16",
                                  "-o", "json"))
    assert offered["quota"] == {"gpu": {"limit": 16, "used": 0}}

    dev_pool = stack.env["POOL"]
    assert stack.ok("capacity", "--pool", dev_pool, "--query", "gpu.allocatable") == "16"
    preview = json.loads(stack.ok("capacity", "--preview", "--pool", dev_pool, "--gpus", "4",
                                  "--for", "2h", "-o", "json"))
    assert (preview["fits"], len(preview["devices"])) == (True, 4)

    reserved = stack.cli("reserve", "--pool", dev_pool, "--gpus", "4", "--for", "1h",
                         "-o", "json")
    assert reserved.returncode == 0, reserved.stderr
    key = reserved.stderr.split("idempotency key: ", 1)[1].split()[0]
    rsv = json.loads(reserved.stdout)
    assert f"reservation: {rsv['id']}" in reserved.stderr.splitlines()  # its own line
    assert rsv["state"] == "active"
    again = stack.ok("reserve", "--pool", dev_pool, "--gpus", "4", "--for", "1h", "--key", key,
                     "--query", "id")
    assert again == rsv["id"]
    assert stack.ok("reservations", "get", rsv["id"], "--query", "state") == "active"
    binding = json.loads(stack.ok("reservations", "get", rsv["id"], "--query", "binding"))
    booked = booked_uuids(stack, rsv["id"])
    assert binding["cdiDevices"] == [f"bcd.dev/gpu={uuid}" for uuid in booked]
    assert binding["nodeId"] == rsv["nodeId"]
    # A simulated machine runs no systemd: a cgroupfs path, not a slice.
    assert binding["cgroupParent"] == f"/bcd/alloc-{rsv['allocationId']}"
    root = node_root(stack, rsv["nodeId"])
    spec_file = root / "etc" / "cdi" / f"bcd-{rsv['allocationId']}.json"
    spec = json.loads(spec_file.read_text())
    assert (spec["kind"], sorted(d["name"] for d in spec["devices"])) == ("bcd.dev/gpu", booked)
    env_file = Path(binding["envFile"])  # a simulated machine's: where it really is
    assert binding["simulated"] is True
    assert env_file == root.resolve() / "run/bcd/allocations" / f"{rsv['allocationId']}.env"
    assert f"BCD_CGROUP_PARENT={binding['cgroupParent']}" in env_file.read_text()
    import subprocess
    import sys

    status = json.loads(subprocess.run(
        [sys.executable, "-m", "bcd", "--root", str(root), "status", "--json"],
        capture_output=True, text=True, check=True, timeout=30).stdout)
    held = sorted(g["uuid"] for g in status["gpus"] if g["heldBy"] == rsv["allocationId"])
    assert held == booked  # bcd status says which GPUs the hold has
    assert status["generations"]["applied"] >= 2
    assert stack.ok("capacity", "--pool", dev_pool, "--query", "gpu.available") == "12"
    events = json.loads(stack.ok("events", "list", "--types", "reservation.*", "-o", "json"))
    assert [e["type"] for e in events["items"] if e["subject"] == rsv["id"]] == [
        "reservation.placed", "reservation.binding", "reservation.active"]
    extended = json.loads(stack.ok("extend", rsv["id"], "--by", "2h", "-o", "json"))
    assert extended["durationMs"] == 3 * 3_600_000
    assert stack.ok("release", rsv["id"], "--query", "state") == "released"
    assert stack.ok("capacity", "--pool", dev_pool, "--query", "gpu.available") == "16"
    assert stack.ok("reservations", "list", "--query", "items.0.state") == "released"
    assert wait_until(lambda: not spec_file.exists() and not env_file.exists())


def test_token_out_file_is_new_and_0600(stack, tmp_path):
    out = tmp_path / "acme-token"
    stack.ok("tokens", "create", "--name", "ci", "--role", "viewer", "--out", str(out))
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert out.read_text().startswith("biam_")
    again = stack.cli("tokens", "create", "--name", "ci", "--out", str(out))
    assert again.returncode != 0
    assert "never overwritten" in again.stderr


@pytest.mark.parametrize("fmt", ["json", "yaml", "table"])
def test_output_formats_on_each_group(stack, fmt):
    for args in (["system", "whoami"], ["sites", "list"], ["pools", "list"],
                 ["tenants", "list"], ["tokens", "list"], ["offerings", "list"],
                 ["events", "list"], ["nodes", "list"], ["reservations", "list"],
                 ["sandboxes", "list"], ["usage", "list"]):
        text = stack.ok(*args, "--output", fmt)
        if fmt == "json":
            assert isinstance(json.loads(text), dict), (args, text)
        elif fmt == "yaml":
            assert isinstance(yaml.safe_load(text), dict), (args, text)
        else:
            assert text.splitlines()[0].isupper() or text == "(none)" or "FIELD" in text


def test_query_prints_a_bare_value_per_group(stack):
    assert stack.ok("nodes", "list", "--query", "items.0.provisionState") == "adopted"
    assert stack.ok("pools", "list", "--query", "items.0.id").startswith("pool_")
    assert stack.ok("tenants", "get", "--query", "slug") == "root"
    missing = stack.cli("pools", "list", "--query", "items.99.id")
    assert missing.returncode != 0
    assert "--query" in missing.stderr


WRONG_TOKEN = "biam_tok_01jbx0000000000000000000aa.abcdefghijklmnopqrstuvwxyz"  # well formed


def test_configuration_errors_are_clear(stack):
    base = {k: v for k, v in stack.env.items() if not k.startswith("BETTER_COMPUTE")}
    url = stack.env["BETTER_COMPUTE_URL"]
    cases = {
        "BETTER_COMPUTE_URL is not set": {},
        "not a loopback address": {"BETTER_COMPUTE_URL": "http://10.1.2.3/api/compute",
                                   "BETTER_COMPUTE_TOKEN": WRONG_TOKEN},
        "BETTER_COMPUTE_TOKEN is not set": {"BETTER_COMPUTE_URL": url},
        "BETTER_COMPUTE_TOKEN is malformed": {"BETTER_COMPUTE_URL": url,
                                              "BETTER_COMPUTE_TOKEN": "biam_…"},
        "unauthenticated": {"BETTER_COMPUTE_URL": url, "BETTER_COMPUTE_TOKEN": WRONG_TOKEN},
        "cannot reach": {"BETTER_COMPUTE_URL": "http://127.0.0.1:9/api/compute",
                         "BETTER_COMPUTE_TOKEN": WRONG_TOKEN},
    }
    for message, extra in cases.items():
        result = stack.cli("system", "whoami", env={**base, **extra})
        assert result.returncode != 0, message
        assert message in result.stderr, (message, result.stderr)
        assert "Traceback" not in result.stderr


def test_api_errors_exit_non_zero_with_code_and_message(stack):
    result = stack.cli("reservations", "get", "pool_01jbx0000000000000000000aa")
    assert result.returncode == 2
    assert result.stderr.startswith("error: invalid_argument: reservationId")


def test_audit_checkpoint_verify_prove_and_check_offline(stack, tmp_path):
    import httpx

    stack.ok("sites", "create", "--kind", "shared", "--region", "audit-1")
    assert json.loads(stack.ok("audit", "checkpoint", "-o", "json"))["treeSize"] > 0
    assert stack.ok("audit", "verify", "--query", "ok") == "true"  # JSON, not Python
    events = json.loads(stack.ok("api", "events.list", "-o", "json"))
    assert events["items"]
    base = stack.env["BETTER_COMPUTE_URL"].removesuffix("/api/compute")
    key = httpx.get(f"{base}/.well-known/better-compute").json()["auditSigningKey"]["publicKey"]
    # The newest audit event covered by the checkpoint: the site created above.
    verify = json.loads(stack.ok("audit", "verify", "-o", "json"))
    assert verify["checkedCheckpoints"] >= 1
    proof_file = tmp_path / "proof.json"
    event_id = _latest_audit_event(stack)
    stack.ok("audit", "prove", event_id, "--out", str(proof_file))
    checked = stack.cli("audit", "check-proof", str(proof_file), "--public-key", key,
                        env={"PATH": os.environ["PATH"]})
    assert checked.returncode == 0, checked.stderr
    assert event_id in checked.stdout


def _latest_audit_event(stack):
    import psycopg

    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        return conn.execute("SELECT a.id FROM audit_auditevent a JOIN audit_checkpoint c ON "
                            "c.tenant_id = a.tenant_id AND a.position <= c.tree_size "
                            "ORDER BY a.seq DESC LIMIT 1").fetchone()[0]


def booked_uuids(stack, rsv_id):
    import psycopg

    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT d.uuid FROM reservations_booking b JOIN reservations_allocation a ON "
            "a.id = b.allocation_id JOIN fleet_device d ON d.id = b.device_id WHERE "
            "a.reservation_id = %s AND a.ended_at IS NULL ORDER BY d.uuid", [rsv_id])
        return [row[0] for row in rows]


def node_root(stack, node_id):
    for root in (stack.state_dir / "sim").iterdir():
        if f'node_id = "{node_id}"' in (root / "etc" / "bcd" / "config.toml").read_text():
            return root
    raise AssertionError(f"no simulated agent is {node_id}")


def test_join_token_to_a_private_file_and_pki_pins(stack, tmp_path):
    out = tmp_path / "join-token"
    stack.ok("join-tokens", "create", "--pool", stack.env["POOL"], "--ttl", "2h",
             "--max-uses", "1", "--expect-serial", "SN-7701", "--key", "join-sn-7701",
             "--out", str(out))
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    assert out.read_text().startswith("bcjt_jtk_")
    again = stack.cli("join-tokens", "create", "--pool", stack.env["POOL"], "--ttl", "2h",
                      "--max-uses", "1", "--expect-serial", "SN-7701", "--key", "join-sn-7701",
                      "--out", str(tmp_path / "again"))
    assert again.returncode != 0
    assert "cannot be shown again" in again.stderr
    listed = json.loads(stack.ok("join-tokens", "list", "-o", "json"))["items"]
    assert any(t["expectSerial"] == "SN-7701" for t in listed)
    for name in ("servingCaSpkiPin", "joinSigningKeyPin", "joinEncryptionKeyPin"):
        assert stack.ok("pki", "show", "--query", name).startswith("sha256/")
    node = stack.ok("nodes", "list", "--pool", stack.env["POOL"], "--query", "items.0.id")
    assert stack.ok("nodes", "get", node, "--query", "provisionState") == "adopted"
    conditions = json.loads(stack.ok("nodes", "get", node, "--query", "conditions"))
    assert {c["type"] for c in conditions} >= {"Adopted", "Reachable", "Schedulable"}
    types = json.loads(stack.ok("nodes", "events", node, "-o", "json"))["items"]
    assert [e["type"] for e in types][:2] == ["node.joined", "node.connected"]


def test_events_watch_streams_a_reservation_in_order_and_resumes_exactly(stack):
    import subprocess
    import threading
    import time

    assert json.loads(stack.ok("events", "list", "-o", "json"))["items"]  # a history exists
    watcher = subprocess.Popen(  # without --since: from now on, none of the history
        ["better-compute", "events", "watch", "--types", "reservation.*", "--output", "json"],
        env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[dict] = []
    threading.Thread(target=lambda: seen.extend(
        json.loads(line) for line in watcher.stdout if line.strip()), daemon=True).start()
    made = []
    try:
        deadline = time.monotonic() + 60
        def reserve_and_release() -> dict:
            made.append(json.loads(stack.ok("reserve", "--pool", stack.env["POOL"], "--gpus",
                                            "2", "--for", "1h", "-o", "json")))
            stack.ok("release", made[-1]["id"])
            return made[-1]

        while not seen and time.monotonic() < deadline:  # until the watch is open and sees
            reserve_and_release()  # (it may open in the middle of one reservation's life)
            time.sleep(0.5)
        rsv = reserve_and_release()  # all of its life after the watch opened
        wait_until(lambda: [e for e in seen if e["subject"] == rsv["id"]][3:], 20)
    finally:
        watcher.terminate()
        watcher.wait(10)
    assert {e["subject"] for e in seen} <= {m["id"] for m in made}  # nothing from before
    mine = [e for e in seen if e["subject"] == rsv["id"]]
    assert [e["type"] for e in mine] == ["reservation.placed", "reservation.binding",
                                         "reservation.active", "reservation.released"]
    # Resuming after the second event gives exactly the last two, no repeats, no gaps.
    resumed = subprocess.Popen(
        ["better-compute", "events", "watch", "--types", "reservation.*", "--output", "json",
         "--since", str(mine[1]["seq"])], env=stack.env, stdout=subprocess.PIPE, text=True)
    try:
        again = [json.loads(resumed.stdout.readline()) for _ in range(2)]
    finally:
        resumed.terminate()
        resumed.wait(10)
    assert [e["seq"] for e in again] == [e["seq"] for e in mine[2:]]


def test_events_watch_needs_a_valid_token(stack):
    env = {**stack.env, "BETTER_COMPUTE_TOKEN": WRONG_TOKEN}
    result = stack.cli("events", "watch", env=env)
    assert result.returncode == 2
    assert "unauthenticated" in result.stderr


def test_help_lists_every_command_and_shows_one(stack):
    listing = stack.ok("help")
    for command in ("sites create", "pools offer", "join-tokens create", "pki show",
                    "daemon install-script", "nodes adopt", "reserve", "release", "extend",
                    "events watch", "sandboxes create", "usage list", "audit verify", "dev",
                    "gateway", "api"):
        assert command in listing, command
    one = stack.ok("help", "pools", "offer")
    assert "--quota" in one
    assert "--to" in one
    bad = stack.cli("help", "nonsense")
    assert bad.returncode != 0


def test_query_and_json_output_on_the_remaining_groups(stack):
    tokens = json.loads(stack.ok("join-tokens", "list", "-o", "json"))["items"]
    assert tokens  # dev minted one for its simulated machines
    assert all(t["id"].startswith("jtk_") and "token" not in t for t in tokens)
    assert json.loads(stack.ok("pki", "show", "-o", "json"))["trustDomain"]
    assert stack.ok("capacity", "--pool", stack.env["POOL"], "--query", "nodes") == "2"
    assert json.loads(stack.ok("capacity", "--pool", stack.env["POOL"], "-o", "json"))["gpu"]
    assert json.loads(stack.ok("audit", "verify", "-o", "json"))["ok"] is True
    offerings = json.loads(stack.ok("offerings", "list", "-o", "json"))["items"]
    assert offerings  # the tutorial test offered the dev pool to acme
    assert all(o["id"].startswith("off_") and "quota" in o for o in offerings)
    assert stack.ok("tokens", "list", "--query", "items.0.id").startswith("tok_")


def test_the_workers_recompute_the_free_time_bookings_mark(stack):
    """Each booking marks its node's free time stale; dev's workers recompute it, and the
    earliest whole-node slot after both nodes' bookings is read from what they wrote."""
    import psycopg

    pool = stack.env["POOL"]
    booked = [json.loads(stack.ok("reserve", "--pool", pool, "--gpus", "8", "--for", "2h",
                                  "--start", "+10d", "-o", "json")) for _ in range(2)]
    try:
        assert {rsv["nodeId"] for rsv in booked} == {n["id"] for n in stack.json(
            "nodes", "list")["items"] if n["role"] == "node"}  # both machines, not the provisioner
        with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
            assert wait_until(lambda: conn.execute(
                "SELECT count(*) FROM reservations_stalegaps").fetchone()[0] == 0, 30)
            tails = dict(conn.execute(
                "SELECT node_id, lo FROM reservations_groupgap WHERE domain = '' "
                "AND hi = 'infinity'").fetchall())
        ends = {rsv["nodeId"]: datetime.fromisoformat(rsv["end"].replace("Z", "+00:00"))
                for rsv in booked}
        assert tails.keys() == ends.keys()  # each node free from the end of its booking
        assert all(abs(tails[node] - end) < timedelta(milliseconds=1)
                   for node, end in ends.items())
        found = json.loads(stack.ok("capacity", "--earliest", "--pool", pool, "--gpus", "8",
                                    "--for", "1h", "--after", "+10d", "-o", "json"))
        first = min(booked, key=lambda rsv: rsv["end"])
        assert (found["nodeId"], found["window"]["start"]) == (first["nodeId"], first["end"])
    finally:
        for rsv in booked:
            stack.ok("release", rsv["id"], "--cancel")


def test_tables_show_ids_whole_on_a_narrow_terminal(stack):
    narrow = {**stack.env, "COLUMNS": "100"}
    nodes = stack.json("nodes", "list")["items"]
    listed = stack.cli("nodes", "list", "-o", "table", env=narrow)
    assert listed.returncode == 0, listed.stderr
    for node in nodes:
        assert node["id"] in listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 100
    capacity = stack.cli("capacity", "--pool", stack.env["POOL"], "-o", "table", env=narrow)
    assert capacity.returncode == 0, capacity.stderr
    lines = capacity.stdout.splitlines()
    assert stack.env["POOL"] in lines[0]
    assert lines[1].split() == ["RESOURCE", "TOTAL", "ALLOCATABLE", "ALLOCATED", "RESERVED",
                                "AVAILABLE"]
    gpu = stack.json("capacity", "--pool", stack.env["POOL"])["gpu"]
    [row] = [line.split() for line in lines if line.startswith("gpu ")]
    assert row[1:] == [str(gpu[k]) for k in ("total", "allocatable", "allocated", "reserved",
                                             "available")]
    assert "{" not in capacity.stdout  # no JSON cut into a cell
