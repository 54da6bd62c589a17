"""The simulator's tenants: reservations now and later (some with a workload on their GPU:
compute.cli.sim.fenced), multi-node ones (gangs), releases (a placed or pending one is
cancelled), extends, sandboxes, commands and cordons, through the public API as any
client sends them (with idempotency keys, retried when the API is down, so a create is
never doubled by a retry)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

from compute.cli.client import ApiError, Client, CliError
from compute.cli.sim.fenced import Workloads
from compute.cli.sim.schedule import Operation

RETRIES = 20  # an API or database restart takes a few seconds; a client waits it out


class Workload:
    def __init__(self, api: Client, pool_id: str, time_scale: float,
                 env: dict[str, str]) -> None:
        self.api, self.pool_id, self.time_scale = api, pool_id, time_scale
        self.lock = threading.Lock()
        self.live: list[str] = []  # reservations created and not ended by us
        self.sandboxes: list[str] = []
        self.ended: list[str] = []  # what we released
        self.nodes: list[str] = []
        self.cordoned: set[str] = set()
        self.outcomes: Counter[str] = Counter()
        self.marks = subprocess.Popen([sys.executable, "-m", "django", "bc_sim_mark"], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.marks_lock = threading.Lock()
        self.workloads = Workloads(api)

    def close(self) -> None:
        self.workloads.close()
        if self.marks.stdin:
            self.marks.stdin.close()
        self.marks.wait(timeout=10)

    def call(self, method: str, body: dict[str, Any]) -> Any:
        """One call, retried while the API or its database is away; refusals (4xx) are
        answers and counted, not retried."""
        for attempt in range(RETRIES):
            try:
                answer = self.api.call(method, body)
                self.count(f"{method} ok")
                return answer
            except ApiError as error:
                if error.status < 500 and error.code != "unavailable":
                    self.count(f"{method} {error.code}")
                    return None
            except CliError:
                pass  # the API is down
            time.sleep(min(2.0, 0.25 * (attempt + 1)))
        self.count(f"{method} gave up")
        return None

    def count(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] += 1

    def mark(self, node_id: str, **pauses: float) -> str | None:
        """Queue a `sim.mark` for the node; its command id (None if it was not queued, the
        database being away for longer than the retries)."""
        line = json.dumps({"node": node_id, "mark": secrets.token_hex(6), **pauses})
        for attempt in range(RETRIES):
            with self.marks_lock:
                if self.marks.stdin is None or self.marks.stdout is None:
                    raise RuntimeError("the command queue helper has no pipes")
                self.marks.stdin.write(line + "\n")
                self.marks.stdin.flush()
                answer = json.loads(self.marks.stdout.readline() or "{}")
            if "command" in answer:
                break
            time.sleep(min(2.0, 0.25 * (attempt + 1)))
        self.count("command queued" if "command" in answer else "command not queued")
        return answer.get("command")

    def apply(self, op: Operation) -> None:
        threads = [threading.Thread(target=self._one, args=(op,)) for _ in range(op.burst)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _pick(self, items: list[str], op: Operation) -> str | None:
        with self.lock:
            return items[op.pick % len(items)] if items else None

    def _one(self, op: Operation) -> None:
        ms = 1000 / self.time_scale
        if op.kind.startswith("reserve"):
            body: dict[str, Any] = {"poolId": self.pool_id,
                                    "devices": [{"class": "gpu", "count": op.gpus}],
                                    "duration": max(1000, int(op.duration * ms)),
                                    "idempotencyKey": secrets.token_hex(12)}
            if op.kind == "reserve-later":
                body["startIn"] = int(op.start_in * ms)
            if op.kind == "reserve-gang":
                body["nodes"] = op.nodes
            made = self.call("reservations.create", body)
            if made:
                with self.lock:
                    self.live.append(made["id"])
                if op.kind == "reserve" and op.pick % 2 == 0:  # half get a workload
                    self.count(self.workloads.start(made, wait=60 / self.time_scale + 15))
        elif op.kind == "release" and (rsv := self._pick(self.live, op)):
            with self.lock:
                if rsv in self.live:
                    self.live.remove(rsv)
                    self.ended.append(rsv)
            self.call("reservations.release", {"reservationId": rsv})
        elif op.kind == "extend" and (rsv := self._pick(self.live, op)):
            self.call("reservations.extend", {"reservationId": rsv,
                                              "by": int(60 * ms)})
        elif op.kind == "sandbox":
            made = self.call("sandboxes.create", {"poolId": self.pool_id, "vcpus": 1,
                                                  "memoryGiB": 1,
                                                  "idempotencyKey": secrets.token_hex(12)})
            if made:
                with self.lock:
                    self.sandboxes.append(made["id"])
        elif op.kind == "sandbox-release" and (box := self._pick(self.sandboxes, op)):
            with self.lock:
                if box in self.sandboxes:
                    self.sandboxes.remove(box)
            self.call("sandboxes.release", {"sandboxId": box})
        elif op.kind == "command" and (node := self._pick(self.nodes, op)):
            self.mark(node)
        elif op.kind == "cordon" and (node := self._pick(self.nodes, op)):
            undo = node in self.cordoned
            if self.call(f"nodes.{'uncordon' if undo else 'cordon'}", {"nodeId": node}):
                with self.lock:
                    (self.cordoned.discard if undo else self.cordoned.add)(node)
