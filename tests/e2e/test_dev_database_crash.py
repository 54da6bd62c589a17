"""`dev`'s Postgres killed with SIGKILL while clients book: dev restarts it, the stack
serves again by itself, and every write that was answered 2xx before the kill is there."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from compute.cli.client import ApiError, Client, CliError, Config
from tests.e2e.conftest import start_stack, stop_stack
from tests.support.waiting import wait_until


def postmaster_pid(output: list[str]) -> int:
    line = next(x for x in output if x.startswith("embedded Postgres runs in "))
    data_dir = Path(line.removeprefix("embedded Postgres runs in ").strip())
    return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


def test_a_killed_postgres_is_restarted_and_keeps_every_acknowledged_write(tmp_path):
    stack = start_stack(tmp_path)
    try:
        env = stack.env
        api = Client(Config(url=env["BETTER_COMPUTE_URL"], token=env["BETTER_COMPUTE_TOKEN"],
                            tenant="root"), timeout=5)
        acknowledged: dict[str, str] = {}  # reservation id -> the state its answer gave
        errors: list[str] = []
        stop = threading.Event()

        def booker() -> None:
            while not stop.is_set():
                try:
                    made = api.call("reservations.create", {
                        "poolId": env["POOL"], "startIn": 86_400_000, "duration": 3_600_000,
                        "devices": [{"class": "gpu", "count": 1}]})
                    acknowledged[made["id"]] = made["state"]
                    done = api.call("reservations.release", {"reservationId": made["id"]})
                    acknowledged[made["id"]] = done["state"]
                except CliError as error:  # refused or cut off while the server is down
                    errors.append(str(error))
                    time.sleep(0.05)

        bookers = [threading.Thread(target=booker) for _ in range(4)]
        for thread in bookers:
            thread.start()
        wait_until(lambda: len(acknowledged) >= 40, timeout=60)
        pid = postmaster_pid(stack.output)
        os.kill(pid, signal.SIGKILL)
        before = dict(acknowledged)  # every answer given before the kill
        wait_until(lambda: len(acknowledged) > len(before) + 20, timeout=90)  # serving again
        stop.set()
        for thread in bookers:
            thread.join()

        assert postmaster_pid(stack.output) != pid
        lost = {}
        for rid, state in before.items():  # an answer lost in the cut may have committed
            try:
                found = api.call("reservations.get", {"reservationId": rid})["state"]
            except ApiError as error:
                found = error.code  # not_found: the write was lost
            if found not in LATER[state]:
                lost[rid] = (state, found)
        assert not lost, lost
        assert errors, "the kill cut some requests off"  # it was not a no-op
    finally:
        assert stop_stack(stack) == 0
    said = stack.process.stdout.read()
    assert "Postgres exited; restarting it" in said, said
    assert "Postgres restarted" in said, said


# What a reservation answered in one state may be found in once the server is back.
LATER = {"cancelled": {"cancelled"}, "placed": {"placed", "cancelled"},
         "pending": {"pending", "placed", "cancelled"}}
