"""bcd and systemd: a hold whose slice cannot be started is refused loudly (AllocationFailed
with systemctl's words, nothing written, never bound); `bcd node` tells systemd it is ready
and pings the watchdog from its event loop."""

from __future__ import annotations

import asyncio
import json
import os
import socket

from bcd.agent import Agent
from bcd.config import Config, Paths
from bcd.contract import ids
from tests.bcd.test_journal import gpus_of, hold


def stand_in_systemctl(tmp_path, monkeypatch, *, start_exit: int) -> None:
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = start ] && { echo "Failed to start $2: Unit '
                    f'$2 has a bad setting." >&2; exit {start_exit}; }}\nexit 0\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")


def test_a_slice_systemd_refuses_fails_the_hold_with_its_reason(root, tmp_path, monkeypatch):
    stand_in_systemctl(tmp_path, monkeypatch, start_exit=1)
    (root / "run/systemd/system").mkdir(parents=True)
    agent = Agent(Config.read(Paths(root).config_file))
    allocation = ids.new("alloc")
    reports = agent.apply_spec(1, {"allocations": [hold(allocation, gpus_of(root, 2))]})
    assert [kind for kind, _, _ in reports] == ["failed"]
    reason = json.loads(reports[0][1])["reason"]
    assert reason.startswith(f"slice: systemctl start bcd-alloc-{allocation}.slice failed "
                             f"(exit 1): Failed to start bcd-alloc-{allocation}.slice: Unit")
    assert agent.held() == {}
    assert not (root / f"run/systemd/system/bcd-alloc-{allocation}.slice").exists()
    assert not list((root / "etc/cdi").glob("bcd-*"))


def test_a_slice_systemd_starts_is_bound(root, tmp_path, monkeypatch):
    stand_in_systemctl(tmp_path, monkeypatch, start_exit=0)
    (root / "run/systemd/system").mkdir(parents=True)
    agent = Agent(Config.read(Paths(root).config_file))
    reports = agent.apply_spec(1, {"allocations": [hold(ids.new("alloc"), gpus_of(root, 1))]})
    assert [kind for kind, _, _ in reports] == ["bound"]


def joined_agent(root) -> Agent:
    """An agent with placeholder certificates: no gateway answers here, so it retries."""
    paths = Paths(root)
    for pem in (paths.cert_file, paths.ca_file):
        pem.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    return Agent(Config.read(paths.config_file))


def test_the_agent_says_ready_and_pings_the_watchdog(root, tmp_path, monkeypatch):
    address = tmp_path / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(address))
    listener.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(address))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping every 0.1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    agent = joined_agent(root)

    async def briefly() -> list[str]:
        running = asyncio.create_task(agent.run())
        said: list[str] = []
        loop = asyncio.get_running_loop()
        while said.count("WATCHDOG=1") < 3:
            said.append((await loop.run_in_executor(None, listener.recv, 256)).decode())
        running.cancel()
        return said

    with listener:
        said = asyncio.run(briefly())
    assert any(s.startswith("READY=1\nSTATUS=node node_x") for s in said)


def test_without_systemd_the_agent_keeps_running(root, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    agent = joined_agent(root)

    async def a_while() -> bool:
        running = asyncio.create_task(agent.run())
        await asyncio.sleep(1.0)
        alive = not running.done()
        running.cancel()
        return alive

    assert asyncio.run(a_while())
