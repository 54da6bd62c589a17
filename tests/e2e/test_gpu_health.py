"""GPU health end to end on `dev --sim 4`: an XID injected into a running simulated node
reaches the ledger within 5 s; the placer avoids the GPU, `capacity` counts it, a future
reservation on it is placed again before its start (the dev pool's `onDeviceFailure` is
replace-future), and healing returns it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

WITHIN = 5.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("health"), "--sim", "4")
    yield running
    stop_stack(running)



def root_of(stack: Stack, node_id: str) -> Path:
    """The private root of the simulated machine that joined as `node_id`."""
    for config in (stack.state_dir / "sim").glob("node-*/etc/bcd/config.toml"):
        if node_id in config.read_text():
            return config.parents[2]
    raise AssertionError(f"no simulated machine is {node_id}")


def inject(stack: Stack, node_id: str, *fault: str) -> None:
    subprocess.run(["bcd", "--root", str(root_of(stack, node_id)), "sim", "inject", *fault],
                   check=True, capture_output=True, text=True, timeout=30)


def gpu(stack: Stack, node_id: str, index: int) -> dict:
    return next(d for d in stack.json("nodes", "get", node_id)["devices"]
                if d["index"] == index)


def wait(seconds: float, check) -> None:
    assert wait_until(check, seconds), f"not within {seconds} s"


def test_an_xid_reaches_the_ledger_moves_a_future_booking_and_heals(stack):
    pool = stack.env["POOL"]
    future = stack.json("reserve", "--pool", pool, "--gpus", "8", "--for", "1h",
                     "--start", "+2h")
    sick = future["nodeId"]
    inject(stack, sick, "--gpu", "3", "xid", "79")
    wait(WITHIN, lambda: gpu(stack, sick, 3)["health"] == "unhealthy")
    assert gpu(stack, sick, 3)["healthReason"] == "XID 79: the GPU has fallen off the bus"
    assert stack.json("capacity", "--pool", pool)["gpusNotSchedulable"]["unhealthy"] == 1
    wait(WITHIN, lambda: stack.json("reservations", "get", future["id"])["nodeId"]
           not in (None, sick))
    moved = stack.json("reservations", "get", future["id"])
    assert (moved["state"], moved["start"]) == ("placed", future["start"])
    types = [e["type"] for e in stack.json("events", "list", "--limit", "1000")["items"]]
    assert "device.unhealthy" in types
    assert "reservation.replaced" in types

    # 8 GPUs now, four times: the sick node (7 healthy GPUs) is never chosen; the three
    # healthy ones each take one (the moved future reservation holds its node's host share
    # only from its start), and the fourth waits.
    now = [stack.json("reserve", "--pool", pool, "--gpus", "8", "--for", "1h", "--wait",
                   "5") for _ in range(4)]
    placed = {r["nodeId"] for r in now if r["state"] != "pending"}
    assert sick not in placed
    assert len(placed) == 3
    inject(stack, sick, "--gpu", "3", "heal")
    wait(WITHIN, lambda: gpu(stack, sick, 3)["health"] == "healthy")
    waiting = [r["id"] for r in now if r["state"] == "pending"]
    wait(10, lambda: sick in {stack.json("reservations", "get", rsv)["nodeId"]
                                for rsv in waiting})
    for rsv in [*now, future]:
        stack.ok("release", rsv["id"])
