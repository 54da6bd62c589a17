"""The unclean GPUs' record is written from two threads (a spec's fence marks, the inventory
pass prunes): neither may lose what the other wrote."""

from __future__ import annotations

import os
import threading

from bcd.contract.holds import Hold
from bcd.unclean import Unclean


def test_a_prune_running_beside_marks_loses_none_of_them(tmp_path):
    unclean = Unclean.load(tmp_path / "unclean.json")
    unclean.left["GPU-gone"] = {"pids": [2 ** 22 + 1], "allocationId": "alloc_gone"}  # no such pid
    survivor = [{"pid": os.getpid()}]  # alive for as long as the test runs
    done, failures = threading.Event(), []

    def prune() -> None:  # always something to forget, so that each pass writes
        try:
            while not done.is_set():
                unclean.prune()
                unclean.left.setdefault("GPU-gone", {"pids": [2 ** 22 + 1],
                                                     "allocationId": "alloc_gone"})
        except Exception as failure:  # e.g. the record changed size while it was read
            failures.append(repr(failure))

    pruner = threading.Thread(target=prune)
    pruner.start()
    try:
        for n in range(100):
            unclean.mark(Hold(f"alloc_{n}", f"rsv_{n}", (f"GPU-{n}",)), survivor)
    finally:
        done.set()
        pruner.join()
    assert failures == []
    kept = {uuid for uuid in unclean.left if uuid != "GPU-gone"}
    assert kept == {f"GPU-{n}" for n in range(100)}
    assert Unclean.load(tmp_path / "unclean.json").left.keys() >= kept  # and on disk
