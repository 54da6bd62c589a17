"""The accelerator probe runs a guest that may hang for ever (a kernel stuck entering long
mode under a nested KVM): it must leave nothing running, when it gives up and when the agent
is killed in the middle of it. A shell that records its pid and sleeps stands in for the
hung guest."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from bcd.qemu import prints


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def _wait_for(path: Path, seconds: float = 10) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def hung_guest(pidfile: Path) -> list[str]:
    return ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 600"]


def test_a_guest_that_prints_its_banner_is_seen():
    assert prints(["sh", "-c", "echo 'Linux version 6.1'; sleep 0.2"], b"Linux version",
                  timeout=5)
    assert not prints(["sh", "-c", "echo SeaBIOS"], b"Linux version", timeout=5)


def test_a_silent_guest_is_killed_when_the_probe_gives_up(tmp_path):
    pidfile = tmp_path / "guest.pid"
    started = time.monotonic()
    assert not prints(hung_guest(pidfile), b"Linux version", timeout=1)
    assert time.monotonic() - started < 5
    assert _gone(_wait_for(pidfile), 2), "the hung guest outlived the probe"


def test_a_probe_killed_mid_way_leaves_no_guest_running(tmp_path):
    pidfile = tmp_path / "guest.pid"
    prober = subprocess.Popen(
        [sys.executable, "-c", "from bcd.qemu import prints; "
         f"prints({hung_guest(pidfile)!r}, b'x', timeout=3)"],
        cwd=Path(__file__).resolve().parents[2])
    guest = _wait_for(pidfile)
    prober.send_signal(signal.SIGKILL)
    prober.wait()
    assert _alive(guest), "the guest should still run right after its prober died"
    assert _gone(guest, 8), "a guest whose prober was killed ran on past the probe's deadline"


def test_the_agents_of_one_host_boot_one_probe_guest_between_them(tmp_path):
    """Four agents start at once (as `dev`'s simulated machines do): one runs the probe,
    the others wait for it and take its answer; a new boot of the host probes again."""
    cache, runs = tmp_path / "accelerator.json", tmp_path / "runs"
    agent = ("import sys, time; from pathlib import Path; from bcd.qemu import once_per_boot\n"
             "def probe():\n"
             f"    with open({str(runs)!r}, 'a') as f: f.write('x')\n"
             "    time.sleep(0.5)\n"
             "    return 'tcg'\n"
             f"print(once_per_boot(Path({str(cache)!r}), sys.argv[1], probe))")
    root = Path(__file__).resolve().parents[2]

    def start(key: str) -> list[subprocess.Popen[str]]:
        return [subprocess.Popen([sys.executable, "-c", agent, key], cwd=root, text=True,
                                 stdout=subprocess.PIPE) for _ in range(4)]

    answers = [process.communicate(timeout=30)[0].strip() for process in start("boot-1")]
    assert answers == ["tcg"] * 4
    assert runs.read_text() == "x", "more than one agent booted a probe guest"
    assert [p.communicate(timeout=30)[0].strip() for p in start("boot-2")] == ["tcg"] * 4
    assert runs.read_text() == "xx"


def test_with_nowhere_to_keep_the_answer_each_agent_probes_for_itself(tmp_path):
    from bcd.qemu import once_per_boot

    runs: list[str] = []
    cache = tmp_path / "missing-folder" / "accelerator.json"
    for _ in range(2):
        assert once_per_boot(cache, "boot-1", lambda: runs.append("x") or "kvm") == "kvm"
    assert runs == ["x", "x"]
