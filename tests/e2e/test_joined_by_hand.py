"""Machines joined by hand with the command `dev` prints (`bcd --root ./machine-N join
--sim`): each is a machine of its own, not a clone of the host. A real clone (the same
identity joined twice) is refused with the reason on its node, and retiring it ends its
session for good."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until


def join_by_hand(stack: Stack, work: Path, name: str, *extra: str) -> str:
    """`bcd --root ./<name> join --sim …` as `dev` prints it; the node id it joined as."""
    token = work / f"{name}-token"
    stack.ok("join-tokens", "create", "--pool", stack.env["POOL"], "--ttl", "1h", "--out",
             str(token))
    pins = stack.json("pki", "show")
    joined = subprocess.run(
        [sys.executable, "-m", "bcd", "--root", str(work / name), "join", "--server",
         stack.env["BETTER_COMPUTE_URL"], "--sim", "--token-file", str(token),
         "--serving-ca-pin", pins["servingCaSpkiPin"],
         "--join-signing-pin", pins["joinSigningKeyPin"],
         "--join-encryption-pin", pins["joinEncryptionKeyPin"], *extra],
        capture_output=True, text=True, timeout=60, check=False)
    assert joined.returncode == 0, joined.stderr
    return joined.stdout.split("joined as ")[1].split()[0]


def run_agent(work: Path, name: str) -> subprocess.Popen[str]:
    log = (work / f"{name}.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "bcd", "--root", str(work / name), "node"],
                            stdout=log, stderr=subprocess.STDOUT, text=True)


def test_machines_joined_by_hand_are_machines_of_their_own(tmp_path):
    stack = start_stack(tmp_path, "--sim", "0")
    work = tmp_path / "work"
    work.mkdir()
    agents = []
    try:
        ids = [join_by_hand(stack, work, name) for name in ("machine-1", "machine-2")]
        agents += [run_agent(work, name) for name in ("machine-1", "machine-2")]
        assert wait_until(lambda: all(stack.json("nodes", "get", n)["provisionState"] ==
                                      "adopted" for n in ids), 120)
        nodes = [stack.json("nodes", "get", n) for n in ids]
        assert [n["hostname"].rsplit("-", 1)[0] for n in nodes] == ["sim-machine-1",
                                                                    "sim-machine-2"]
        assert len({n["serial"] for n in nodes}) == 2
        assert not {d["uuid"] for d in nodes[0]["devices"]} & \
            {d["uuid"] for d in nodes[1]["devices"]}

        clone = join_by_hand(stack, work, "clone", "--hostname", nodes[0]["hostname"])
        agents.append(run_agent(work, "clone"))
        assert wait_until(lambda: stack.json("nodes", "get", clone)["inventoryRefused"], 60)
        shown = stack.json("nodes", "get", clone)
        assert ids[0] in shown["inventoryRefused"], shown["inventoryRefused"]
        assert shown["provisionState"] == "adopting"
        said = stack.ok("nodes", "get", clone)
        assert "InventoryTaken" in said
        assert ids[0] in said

        retired = stack.json("nodes", "retire", clone, "--reason", "a clone of machine-1")
        assert retired["provisionState"] == "retired"
        assert wait_until(lambda: "may not connect" in (work / "clone.log").read_text(), 60)
        [row] = stack.json("audit", "list", "--action", "node.retire", "--target",
                           clone)["items"]
        assert row["reason"] == "a clone of machine-1"
        assert stack.json("nodes", "get", ids[0])["schedulable"]
    finally:
        for agent in agents:
            agent.terminate()
            agent.wait(timeout=30)
        assert stop_stack(stack) == 0
