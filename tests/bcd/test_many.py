"""Many simulated machines in one process (`bcd sim agents`): machines that have not joined
join a few at a time and are retried, a join that keeps failing says which machine, and each
machine's log lines go to its own file. (Running them against a real gateway is `dev`'s
end-to-end test.)"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from bcd import many
from bcd.config import Config
from bcd.join.documents import JoinError, JoinRefused, Pins

PINS = Pins("sha256/a", "sha256/b", "sha256/c")


class FakeJoins:
    """`bcd.join.client.join` as a control plane that refuses each machine's first
    `failures` attempts, counting how many joins were in flight at once."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts: dict[str, int] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()

    def __call__(self, *, root: Path, hostname: str | None, **_: Any) -> tuple[Config, str]:
        with self.lock:
            self.attempts[root.name] = self.attempts.get(root.name, 0) + 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            attempt = self.attempts[root.name]
        try:
            time.sleep(0.05)
            if attempt <= self.failures and attempt % 2:  # the gateway not reached
                raise grpc.RpcError("failed to connect to all addresses")
            if attempt <= self.failures:
                raise JoinError("the control plane did not answer in time")
            config = Config(server="https://cp", gateway="gw:1", node_id=f"node_{root.name}",
                            site_id="site_1", trust_domain="td", serving_ca_pin="a",
                            join_signing_pin="b", join_encryption_pin="c", root=str(root),
                            sim=True, hostname=hostname or "")
            config.paths.config_dir.mkdir(parents=True)
            config.write(config.paths.config_file)
            for written in (config.paths.key_file, config.paths.cert_file):
                written.write_text("x")
            return config, "tomorrow"
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(many, "JOIN_BACKOFF_SECONDS", 0.01)


def test_machines_join_a_few_at_a_time_and_are_retried(tmp_path, monkeypatch, quick_backoff):
    joins = FakeJoins(failures=2)
    monkeypatch.setattr(many, "join", joins)
    roots = [tmp_path / f"node-{n:02d}" for n in range(1, 13)]
    joining = many.Joining(server="https://cp", token="bcjt_x", pins=PINS, at_once=3,
                           hostname=lambda root: f"gpu-{root.name.removeprefix('node-')}")
    configs = asyncio.run(many.join_all(roots, joining))
    assert [c.node_id for c in configs] == [f"node_{root.name}" for root in roots]
    assert [c.hostname for c in configs][:2] == ["gpu-01", "gpu-02"]
    assert set(joins.attempts.values()) == {3}  # not reached, refused, then joined
    assert 1 < joins.most_in_flight <= 3


def test_a_machine_that_never_joins_is_named_and_joined_ones_are_not_joined_again(
        tmp_path, monkeypatch, quick_backoff):
    joins = FakeJoins(failures=0)
    monkeypatch.setattr(many, "join", joins)
    roots = [tmp_path / "node-01", tmp_path / "node-02"]
    joining = many.Joining(server="https://cp", token="bcjt_x", pins=PINS)
    asyncio.run(many.join_all(roots[:1], joining))
    joins.failures = many.JOIN_ATTEMPTS
    with pytest.raises(JoinError, match="node-02: the control plane did not answer"):
        asyncio.run(many.join_all(roots, joining))
    assert joins.attempts == {"node-01": 1, "node-02": many.JOIN_ATTEMPTS}
    with pytest.raises(JoinError, match=r"1 machine.* have not joined .node-02"):
        asyncio.run(many.join_all(roots, None))  # and without a token, nothing is tried


def test_a_refused_join_is_not_asked_again(tmp_path, monkeypatch, quick_backoff):
    attempts = []

    def refusing(*, root: Path, **_: Any) -> tuple[Config, str]:
        attempts.append(root.name)
        raise JoinRefused("the control plane refused the join: token spent")

    monkeypatch.setattr(many, "join", refusing)
    joining = many.Joining(server="https://cp", token="bcjt_x", pins=PINS)
    with pytest.raises(JoinError, match="node-01: the control plane refused the join"):
        asyncio.run(many.join_all([tmp_path / "node-01"], joining))
    assert attempts == ["node-01"]


def test_each_machine_logs_to_its_own_file(tmp_path):
    lines: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = many.MachineLogs(tmp_path, Kept())
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("bcd.test-many")
    log.addHandler(handler)
    log.propagate = False

    async def machine(name: str) -> None:
        many.MACHINE.set(name)
        log.warning("%s starts", name)
        await asyncio.to_thread(log.warning, "%s reads its inventory on a thread", name)

    async def both() -> None:
        await asyncio.gather(machine("node-01"), machine("node-02"))

    try:
        asyncio.run(both())
        log.warning("the process itself")
    finally:
        log.removeHandler(handler)
        handler.close()
    assert (tmp_path / "sim-node-01.log").read_text().splitlines() == [
        "WARNING node-01 starts", "WARNING node-01 reads its inventory on a thread"]
    assert "node-01" not in (tmp_path / "sim-node-02.log").read_text()
    assert lines == ["the process itself"]


def test_a_stop_while_machines_join_ends_the_process_without_running_them(tmp_path,
                                                                          monkeypatch):
    """`dev` stopping while its machines still join (TERM): the process ends when the joins
    in flight return, and starts no agent."""
    import os
    import signal

    def slow_join(**_: Any) -> tuple[Config, str]:
        time.sleep(1.0)
        raise JoinError("the control plane did not answer in time")

    monkeypatch.setattr(many, "join", slow_join)
    monkeypatch.setattr(many, "Agent", None)  # (an agent started would fail loudly)
    roots = [tmp_path / f"node-{n:02d}" for n in range(1, 5)]
    joining = many.Joining(server="https://cp", token="bcjt_x", pins=PINS, at_once=2)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    began = time.monotonic()
    asyncio.run(many.run_machines(roots, joining=joining))
    assert time.monotonic() - began < 5  # not the 4 attempts with their backoff


def test_bad_options_are_refused_before_anything_runs(tmp_path, capsys):
    from bcd.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["sim", "agents", str(tmp_path / "node-01"), "--join-at-once", "0"])
    assert exited.value.code == 2
    assert "0 joins at once would join no machine" in capsys.readouterr().err
    assert main(["sim", "agents", str(tmp_path / "node-01"), "--place", "node-01"]) == 2
    assert "--place takes NAME=rack=R,rail=L" in capsys.readouterr().err
    assert main(["sim", "agents", str(tmp_path / "node-01")]) == 2  # not joined, no server
    assert "give --server and the three pins" in capsys.readouterr().err
    assert not (tmp_path / "node-01").exists()


def test_one_thread_takes_every_machines_gpu_events_and_one_broken_machine_blinds_none(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bcd.inventory.fake import SimulatedInventory
    from bcd.inventory.faults import faults_file, inject

    monkeypatch.setattr(many, "EVENTS_SECONDS", 0.05)

    class Broken:
        def take_events(self) -> None:
            raise OSError("its faults file is unreadable")

    roots = [tmp_path / f"node-{n:02d}" for n in range(1, 4)]
    inventories = [SimulatedInventory(root.name, root=str(root)) for root in roots]
    machines = [SimpleNamespace(config=SimpleNamespace(root=str(root)), inventory=inventory)
                for root, inventory in zip(roots, inventories, strict=True)]
    machines.insert(1, SimpleNamespace(config=SimpleNamespace(root=str(tmp_path / "bad")),
                                       inventory=Broken()))
    inject(faults_file(roots[0]), 4, "xid", 79)
    inject(faults_file(roots[2]), 1, "xid", 48)
    threads_before = threading.active_count()
    stopped = threading.Event()
    looking = threading.Thread(target=many.look_at_events, args=(machines, stopped))
    looking.start()
    try:
        def reasons() -> list[list[str]]:
            return [[g.get("healthReason", "") for g in inventory.report()["gpus"]]
                    for inventory in inventories]

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (reasons()[0][4] and reasons()[2][1]):
            time.sleep(0.05)
        found = reasons()
        assert found[0][4] == "XID 79: the GPU has fallen off the bus"
        assert found[2][1].startswith("XID 48")
        assert not any(found[1])
        assert found[0][:4] == ["", "", "", ""]
        assert threading.active_count() == threads_before + 1  # one thread for all of them
    finally:
        stopped.set()
        looking.join(5)
    assert not looking.is_alive()


def test_a_root_too_deep_for_the_status_socket_is_named_not_a_socket_error(tmp_path):
    from bcd.agent import UNIX_PATH_MAX, Agent

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    config = Config(server="https://cp", gateway="gw:1", node_id="node_deep", site_id="s",
                    trust_domain="td", serving_ca_pin="a", join_signing_pin="b",
                    join_encryption_pin="c", root=str(deep), sim=True)
    agent = Agent(config)
    assert len(str(agent.paths.socket)) > UNIX_PATH_MAX
    with pytest.raises(OSError, match="shorter --root"):
        asyncio.run(agent.serve_status())
