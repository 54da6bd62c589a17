"""sushy-tools' Redfish emulator as a real process on a loopback port: a BMC to enroll.

The fake driver keeps each system's power state and boot settings; the libvirt driver
drives real QEMU VMs (libvirt domains) instead. Its request log (one line per HTTP request)
shows every action the provisioner took.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bcrypt
import httpx

from tests.support.processes import free_port

USERNAME = "admin"
ANSI_STYLE = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Emulator:
    root: Path
    password: str
    systems: list[dict[str, Any]]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    libvirt: str = ""  # a libvirt URI: the systems are that libvirt's domains (by UUID)

    @property
    def log(self) -> Path:
        return self.root / "requests.log"

    def bmc(self, uuid: str) -> str:
        return f"redfish+http://127.0.0.1:{self.port}/redfish/v1/Systems/{uuid}"

    def start(self) -> Emulator:
        self.root.mkdir(parents=True, exist_ok=True)
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()
        (self.root / "htpasswd").write_text(f"{USERNAME}:{hashed}\n")
        driver = (f"SUSHY_EMULATOR_LIBVIRT_URI = {self.libvirt!r}\n"
                  "SUSHY_EMULATOR_ALLOWED_INSTANCES = "
                  f"{[system['uuid'] for system in self.systems]!r}\n" if self.libvirt else
                  "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
                  f"SUSHY_EMULATOR_FAKE_SYSTEMS = {self.systems!r}\n")
        (self.root / "emulator.conf").write_text(
            f"SUSHY_EMULATOR_AUTH_FILE = {str(self.root / 'htpasswd')!r}\n"
            f"SUSHY_EMULATOR_STATE_DIR = {str(self.root / 'state')!r}\n" + driver)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sushy_tools.emulator.main", "--config",
                 str(self.root / "emulator.conf"), "-i", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/redfish/v1/", timeout=1).is_success:
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"the Redfish emulator exited:\n{self.log.read_text()}")
            time.sleep(0.2)
        raise RuntimeError("the Redfish emulator did not answer within 30 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def system(self, uuid: str) -> dict[str, Any]:
        """The system as the BMC shows it now."""
        return self.get(f"/redfish/v1/Systems/{uuid}")

    def get(self, path: str) -> dict[str, Any]:
        """A Redfish resource as the BMC shows it now."""
        answer = httpx.get(f"http://127.0.0.1:{self.port}{path}",
                           auth=(USERNAME, self.password), timeout=5)
        answer.raise_for_status()
        return answer.json()

    def requests(self, method: str, path_part: str) -> int:
        """How many `method` requests with `path_part` in their path the BMC served (its log
        may colour them: CI=true in the environment turns werkzeug's colours on)."""
        text = ANSI_STYLE.sub("", self.log.read_text(errors="replace"))
        return sum(1 for line in text.splitlines() if f'"{method} ' in line and path_part in line)


@contextmanager
def served(directory: Path) -> Iterator[str]:
    """Serve `directory` over HTTP on loopback (the BMC downloads the media it inserts)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        SimpleHTTPRequestHandler, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
