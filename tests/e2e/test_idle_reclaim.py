"""Idle reclaim end to end: real agents report GPU utilization (`bcd sim inject util`
sets it) every second over the gateway, and an offering's rule warns, then releases the
reservation whose GPUs sit idle; the one whose GPUs work stays."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.test_tutorial_cli import booked_uuids, node_root
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("idle"), "--sim", "1",
                          env_extra={"BCD_TELEMETRY_SECONDS": "1"})
    yield running
    stop_stack(running)


def set_load(stack: Stack, rsv: dict, percent: int) -> None:
    """Every GPU of the reservation reports `percent` utilization from now on."""
    root = node_root(stack, rsv["nodeId"])
    indexes = [d["index"] for d in stack.json("nodes", "get", rsv["nodeId"])["devices"]
               if d["uuid"] in booked_uuids(stack, rsv["id"])]
    for index in indexes:
        subprocess.run([sys.executable, "-m", "bcd", "--root", str(root), "sim", "inject",
                        "--gpu", str(index), "util", str(percent)],
                       check=True, capture_output=True, timeout=30)


def test_the_idle_reservation_is_warned_then_released_and_the_busy_one_stays(stack):
    pool = stack.env["POOL"]
    stack.ok("tenants", "create", "--slug", "acme")
    offering = stack.json("pools", "offer", pool, "--to", "acme", "--quota", "gpu=8",
                          "--idle-below", "5", "--idle-for", "0.1", "--idle-release",
                          "--idle-grace", "0.05")
    assert offering["limits"]["idleReclaim"] == {"belowPercent": 5.0, "forMinutes": 0.1,
                                                 "release": True, "graceMinutes": 0.05}
    member = stack.ok("tokens", "create", "--name", "ml", "--role", "member", "--tenant",
                      "acme", "--query", "token")
    acme = {**stack.env, "BETTER_COMPUTE_TOKEN": member, "BETTER_COMPUTE_TENANT": "acme"}
    idle = stack.json("reserve", "--pool", pool, "--gpus", "2", "--for", "1h", env=acme)
    busy = stack.json("reserve", "--pool", pool, "--gpus", "2", "--for", "1h", env=acme)
    assert (idle["state"], busy["state"]) == ("active", "active")
    set_load(stack, idle, 0)
    set_load(stack, busy, 90)

    def state(rsv: dict) -> dict:
        return stack.json("reservations", "get", rsv["id"], env=acme)

    assert wait_until(lambda: state(idle)["state"] == "released", timeout=60)
    ended = state(idle)
    assert ended["failureReason"].startswith("reclaimed: GPUs under 5% utilization")
    events = stack.json("events", "list", "--types", "reservation.*", env=acme)["items"]
    mine = [e["type"] for e in events if e["subject"] == idle["id"]]
    assert mine.index("reservation.idle") < mine.index("reservation.released")
    audit = stack.json("audit", "list", "--action", "reservation.reclaim", env=acme)["items"]
    assert [a["target"] for a in audit] == [idle["id"]]
    assert state(busy)["state"] == "active"
    assert "reservation.idle" not in [e["type"] for e in events if e["subject"] == busy["id"]]
    assert stack.cli("release", busy["id"], env=acme).returncode == 0
