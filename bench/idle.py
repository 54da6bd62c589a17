"""What an idle `better-compute dev --memory --sim 2` costs: CPU seconds per minute of each
queue worker (and of the whole stack) while nothing happens.

    python -m bench.idle                      # this tree
    python -m bench.idle --tree /path/to/old  # another checkout, for a baseline
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import process_cpu_seconds


def children_of(root_pid: int) -> dict[int, str]:
    listing = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True,
                             check=True).stdout.splitlines()[1:]
    parents = {int(line.split()[0]): (int(line.split()[1]), line.split(None, 2)[2])
               for line in listing}
    found, frontier = {}, {root_pid}
    while frontier:
        frontier = {pid for pid, (ppid, _) in parents.items() if ppid in frontier}
        found.update({pid: parents[pid][1] for pid in frontier})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    env = {**os.environ, "PYTHONPATH": str(args.tree)}
    dev = subprocess.Popen([sys.executable, "-m", "compute.cli.main", "dev", "--memory", "--sim",
                            "2", "--state-dir", str(state), "--port", "3917"], cwd=args.tree,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in dev.stdout or []:
            if line.startswith("Ctrl-C stops everything"):
                break
        time.sleep(5)  # let start-up work settle
        processes = children_of(dev.pid)
        before = {pid: process_cpu_seconds(pid) for pid in processes}
        time.sleep(args.seconds)
        used = {pid: process_cpu_seconds(pid) - before[pid] for pid in processes
                if Path(f"/proc/{pid}").exists()}
        per_minute = 60 / args.seconds
        workers = [used[pid] * per_minute for pid, argv in processes.items()
                   if "bc_worker" in argv and pid in used]
        print(f"tree {args.tree}: idle for {args.seconds:.0f} s")
        for n, seconds in enumerate(workers, 1):
            print(f"  queue worker {n}: {seconds:.2f} CPU s/min ({seconds / 60:.1%} of a core)")
        print(f"  whole stack ({len(used)} processes): "
              f"{sum(used.values()) * per_minute:.2f} CPU s/min")
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(60)


if __name__ == "__main__":
    main()
