"""Several gateways: the well-known document publishes each, agents spread over them, and the
nodes of a gateway killed with -9 are connected through another within seconds; the specs of
their holds and the commands queued for them follow them there."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from bcd.config import Paths, joined_config
from tests.e2e.conftest import start_stack, stop_stack
from tests.support.waiting import wait_until

MOVE_BOUND_SECONDS = 15  # a lost session is tried again on the next gateway within ~1 s


@pytest.fixture
def stack(tmp_path):
    # The killed gateway is not restarted while the test looks (dev restarts what dies).
    running = start_stack(tmp_path, "--sim", "4", "--gateways", "2",
                          env_extra={"BETTER_COMPUTE_DEV_RESTART_SECONDS": "300"})
    yield running
    stop_stack(running)


def nodes(stack) -> dict[str, dict]:
    listed = stack.json("nodes", "list", "--pool", stack.env["POOL"])["items"]
    return {n["id"]: n for n in listed if n["role"] == "node"}


def kill_gateway(stack, name: str) -> None:
    dev = psutil.Process(stack.process.pid)
    doomed = [child for child in dev.children(recursive=True)
              if " -m gateway " in " ".join(child.cmdline())
              and child.cmdline()[-1] == name]
    assert len(doomed) == 1, name
    doomed[0].send_signal(signal.SIGKILL)


def test_the_nodes_of_a_killed_gateway_move_to_another_and_their_holds_follow(stack):
    published = httpx.get(stack.env["BETTER_COMPUTE_URL"].replace(
        "/api/compute", "/.well-known/better-compute")).json()
    assert len(published["gatewayUrls"]) == 2
    assert published["gatewayUrl"] == published["gatewayUrls"][0]  # for agents before 0.2

    def all_connected() -> bool:
        found = nodes(stack)
        return len(found) == 4 and all(n["connectivity"] == "connected" and n["gateway"]
                                       for n in found.values())

    assert wait_until(all_connected, 120), nodes(stack)
    before = {node_id: n["gateway"] for node_id, n in nodes(stack).items()}
    assert set(before.values()) <= {"gateway", "gateway-2"}
    counts = {name: list(before.values()).count(name) for name in ("gateway", "gateway-2")}
    victim = max(counts, key=counts.__getitem__)
    survivor = "gateway-2" if victim == "gateway" else "gateway"
    moved = sorted(node_id for node_id, name in before.items() if name == victim)
    epochs = {node_id: n["sessionEpoch"] for node_id, n in nodes(stack).items()}

    kill_gateway(stack, victim)
    killed_at = time.monotonic()

    def moved_over() -> bool:
        now = nodes(stack)
        return all(now[node_id]["gateway"] == survivor and now[node_id]["sessionEpoch"] >
                   epochs[node_id] and now[node_id]["connectivity"] == "connected"
                   for node_id in moved)

    assert wait_until(moved_over, MOVE_BOUND_SECONDS * 2), nodes(stack)
    took = time.monotonic() - killed_at
    assert took < MOVE_BOUND_SECONDS, f"{len(moved)} nodes moved to {survivor} in {took:.1f} s"
    # Each node gets a whole-node hold: the specs reach the moved nodes through the survivor.
    held = [stack.json("reserve", "--pool", stack.env["POOL"], "--gpus", "8", "--for", "1h")
            for _ in range(4)]

    def active() -> set[str]:
        return {r["nodeId"] for r in (stack.json("reservations", "get", h["id"]) for h in held)
                if r["state"] == "active"}

    assert wait_until(lambda: active() == set(before), 120), active()

    # A command queued for each moved node reaches it through the survivor and runs once.
    queued = subprocess.run(
        [sys.executable, "-m", "django", "bc_sim_mark"], env={
            **stack.env, "DJANGO_SETTINGS_MODULE": "compute.project.settings"},
        input="".join(json.dumps({"node": node_id, "mark": f"after-move-{node_id}"}) + "\n"
                      for node_id in moved), capture_output=True, text=True, timeout=120)
    assert queued.returncode == 0, queued.stderr
    roots = {config.node_id: Paths(root) for root in (stack.state_dir / "sim").iterdir()
             if (config := joined_config(Paths(root))) is not None}

    def marked(node_id: str) -> list[str]:
        marks = roots[node_id].state_dir / "marks"
        return marks.read_text().split() if marks.exists() else []

    assert wait_until(lambda: all(f"after-move-{n}" in marked(n) for n in moved), 60), \
        {n: marked(n) for n in moved}
    assert all(marked(n).count(f"after-move-{n}") == 1 for n in moved)
