"""Reconcilers against the dev stack with short heartbeats and lease: windows start and end
without any client call, and a frozen gateway makes nodes unreachable without releasing."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.e2e.conftest import start_stack, stop_stack
from tests.support.waiting import wait_until

# A dead gateway stays down for longer than a lease.
FAST = {"BETTER_COMPUTE_HEARTBEAT_SECONDS": "1", "BETTER_COMPUTE_NODE_LEASE_SECONDS": "3",
        "BETTER_COMPUTE_DEV_RESTART_SECONDS": "8"}


@pytest.fixture(scope="module")
def fast_stack(tmp_path_factory):
    stack = start_stack(tmp_path_factory.mktemp("fast"), "--sim", "2", env_extra=FAST)
    yield stack
    stop_stack(stack)


def state(stack, rsv_id):
    return stack.ok("reservations", "get", rsv_id, "--query", "state")


def test_a_future_window_becomes_active_at_its_start_and_is_released_at_its_end(fast_stack):
    rsv = json.loads(fast_stack.ok("reserve", "--pool", fast_stack.env["POOL"], "--gpus", "2",
                                   "--for", "4s", "--start", "+3s", "-o", "json"))
    assert rsv["state"] == "placed"
    assert wait_until(lambda: state(fast_stack, rsv["id"]) == "active", 20)
    assert wait_until(lambda: state(fast_stack, rsv["id"]) == "released", 20)
    events = json.loads(fast_stack.ok("events", "list", "--types", "reservation.*", "--limit",
                                      "1000", "-o", "json"))["items"]
    mine = [e["type"] for e in events if e["subject"] == rsv["id"]]
    assert [t for t in mine if t != "reservation.ending"] == [
        "reservation.placed", "reservation.binding", "reservation.active",
        "reservation.released"]
    # a 4 s booking is within the 1-minute notice as soon as it starts: that one only
    assert mine.count("reservation.ending") == 1
    assert mine.index("reservation.binding") < mine.index("reservation.ending") < mine.index(
        "reservation.released")
    usage = json.loads(fast_stack.ok("usage", "list", "--subject", rsv["id"], "-o", "json"))
    assert usage["items"]
    assert all(u["subject"] == rsv["id"] for u in usage["items"])


def gateway_pid(stack):
    listing = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True,
                             check=True).stdout
    return next(int(line.split()[0]) for line in listing.splitlines()
                if "-m gateway" in line and str(stack.state_dir) in line)


def test_a_frozen_gateway_makes_nodes_unreachable_and_releases_nothing(fast_stack):
    pool = fast_stack.env["POOL"]
    rsv = json.loads(fast_stack.ok("reserve", "--pool", pool, "--gpus", "4", "--for", "1h",
                                   "-o", "json"))
    assert rsv["state"] == "active"
    pid = gateway_pid(fast_stack)
    os.kill(pid, signal.SIGSTOP)  # a partition: sessions stay open, nothing flows
    try:
        def connectivity():
            nodes = json.loads(fast_stack.ok("nodes", "list", "--pool", pool, "-o", "json"))
            return {n["connectivity"] for n in nodes["items"]}

        assert wait_until(lambda: connectivity() == {"unreachable"}, 20)
        assert state(fast_stack, rsv["id"]) == "active"
        pending = json.loads(fast_stack.ok("reserve", "--pool", pool, "--gpus", "1", "--for",
                                           "1h", "--wait", "1", "-o", "json"))
        assert pending["state"] == "pending"  # unreachable nodes are unschedulable
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_until(lambda: connectivity() == {"connected"}, 30)
    assert state(fast_stack, rsv["id"]) == "active"
    assert wait_until(lambda: state(fast_stack, pending["id"]) == "active", 30)
    node = rsv["nodeId"]
    types = [e["type"] for e in json.loads(fast_stack.ok("nodes", "events", node,
                                                         "-o", "json"))["items"]]
    assert types.index("node.unreachable") < types.index("node.reconnected")


def test_a_killed_gateway_makes_nodes_unreachable_releases_nothing_and_all_converges(
        fast_stack):
    pool = fast_stack.env["POOL"]
    rsv = json.loads(fast_stack.ok("reserve", "--pool", pool, "--gpus", "2", "--for", "1h",
                                   "-o", "json"))
    assert rsv["state"] == "active"
    os.kill(gateway_pid(fast_stack), signal.SIGKILL)

    def connectivity():
        nodes = json.loads(fast_stack.ok("nodes", "list", "--pool", pool, "-o", "json"))
        return {n["connectivity"] for n in nodes["items"]}

    assert wait_until(lambda: connectivity() == {"unreachable"}, 20)
    assert state(fast_stack, rsv["id"]) == "active"  # disconnected is not dead
    # dev restarts the gateway (after 8 s); the agents reconnect and all converges.
    assert wait_until(lambda: connectivity() == {"connected"}, 60)
    assert state(fast_stack, rsv["id"]) == "active"
    released = json.loads(fast_stack.ok("release", rsv["id"], "-o", "json"))
    assert released["state"] == "released"
