"""`client.sandbox(pool=…)`: a sandbox for the length of a `with` block.

    with client.sandbox(pool="pool_…") as sb:
        print(sb.exec("python3", "-c", "print(1 + 1)").stdout)
        sb.put("/run/data.csv", b"a,b\\n1,2\\n")

The sandbox is created on entry, waited for until it runs, and released on exit.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass
from typing import Any

from compute.client.transport import ClientError, Transport


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool


class Sandbox:
    def __init__(self, transport: Transport, *, pool: str, vcpus: int = 1, memory_gib: int = 1,
                 image: str | None = None, network: str | None = None,
                 boot_seconds: float = 300.0) -> None:
        self.transport = transport
        self.request = {"poolId": pool, "vcpus": vcpus, "memoryGiB": memory_gib,
                        "image": image, "network": network}
        self.boot_seconds = boot_seconds
        self.id = ""

    def __enter__(self) -> Sandbox:
        created = self.transport.call("sandboxes.create", {
            **self.request, "idempotencyKey": f"client-{uuid.uuid4()}"}, retry=True)
        self.id = created["id"]
        deadline = time.monotonic() + self.boot_seconds
        while (state := self.get()["state"]) in ("placed", "starting"):
            if time.monotonic() > deadline:
                self.release()
                raise ClientError(f"sandbox {self.id} did not boot in {self.boot_seconds:.0f} s")
            time.sleep(0.1)
        if state != "running":
            raise ClientError(f"sandbox {self.id} is {state}: {self.get()['failureReason']}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def get(self) -> Any:
        return self.transport.call("sandboxes.get", {"sandboxId": self.id}, retry=True)

    def release(self) -> None:
        if self.id and self.get()["state"] in ("placed", "starting", "running", "paused"):
            self.transport.call("sandboxes.release", {"sandboxId": self.id})

    def exec(self, *argv: str, timeout: float = 60.0) -> ExecResult:
        """Run `argv` (no shell: exec("sh", "-c", "…") for one) and wait for it."""
        said = self.transport.call("sandboxes.exec", {
            "sandboxId": self.id, "argv": list(argv), "timeoutSeconds": timeout},
            timeout=timeout + 60)
        return ExecResult(said["exitCode"], said["stdout"], said["stderr"], said["timedOut"])

    def put(self, path: str, data: bytes) -> None:
        self.transport.call("sandboxes.put", {"sandboxId": self.id, "path": path,
                                              "content": base64.b64encode(data).decode()},
                            timeout=120)

    def read(self, path: str) -> bytes:
        said = self.transport.call("sandboxes.fetch", {"sandboxId": self.id, "path": path},
                                   retry=True, timeout=120)
        return base64.b64decode(said["content"])
