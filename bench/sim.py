"""The fleet simulator's campaign: many seeds, each a whole run, and a table of results.

    python -m bench.sim --seeds 100 --minutes 10 [--nodes 4] [--time-scale 10] [--first 1]
                        [--keep-failed DIR]

Each seed runs `better-compute sim run --output json` (its own Postgres, control plane and
agents) one after another. The table shows each seed's faults, operations, invariants and
how long convergence and the whole run took; the summary counts passes and names the
command that reruns each failing seed with the same faults. With `--keep-failed DIR`, a
failing seed's state folder (its processes' logs, the machines' files and a stopped copy of
its database) is kept in DIR/seed-N.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from bench.common import table

CHECKS = ("I1", "I2", "I3", "I4", "I5", "IAM")


def one(seed: int, args: argparse.Namespace) -> dict:
    command = ["better-compute", "sim", "run", "--seed", str(seed), "--nodes", str(args.nodes),
               "--minutes", str(args.minutes), "--time-scale", str(args.time_scale),
               "--output", "json"]
    kept = args.keep_failed / f"seed-{seed}" if args.keep_failed else None
    state = ["--state-dir", str(kept)] if kept else []
    began = time.monotonic()
    done = subprocess.run(command + state, capture_output=True, text=True, check=False)
    if kept and done.returncode == 0:
        shutil.rmtree(kept, ignore_errors=True)
    lines = done.stdout.strip().splitlines()
    if not lines:
        return {"seed": seed, "passed": False, "seconds": time.monotonic() - began,
                "error": done.stderr.strip()[-300:], "invariants": {}, "faults": [],
                "outcomes": {}, "rerun": " ".join(command[:-2])}
    report = json.loads(lines[-1])
    return {**report, "rerun": " ".join(command[:-2])}


def row(report: dict) -> dict[str, str]:
    inv = report["invariants"]
    converged = inv.get("I3", {}).get("summary", "").split(" s after")[0].replace(
        "converged ", "")
    ops = sum(n for k, n in report["outcomes"].items() if not k.startswith("nodes.list"))
    return {"seed": str(report["seed"]), "faults": str(len(report["faults"])), "ops": str(ops),
            **{c: "ok" if inv.get(c, {}).get("ok") else "FAIL" for c in CHECKS},
            "converged s": converged if inv.get("I3", {}).get("ok") else "-",
            "run s": f"{report['seconds']:.0f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=10)
    parser.add_argument("--keep-failed", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    reports = []
    for seed in range(args.first, args.first + args.seeds):
        reports.append(one(seed, args))
        print(f"seed {seed}: {'passed' if reports[-1]['passed'] else 'FAILED'} in "
              f"{reports[-1]['seconds']:.0f} s", flush=True)
    print(table([row(r) for r in reports]))
    passed = [r for r in reports if r["passed"]]
    seconds = [r["seconds"] for r in reports]
    print(f"\n{len(passed)}/{len(reports)} seeds passed every invariant; "
          f"{sum(len(r['faults']) for r in reports)} faults injected; a seed took "
          f"{statistics.mean(seconds):.0f} s on average (max {max(seconds):.0f} s) for "
          f"{args.minutes:g} simulated minutes at x{args.time_scale:g}")
    for failed in (r for r in reports if not r["passed"]):
        problems = {c: v["problems"][:2] for c, v in failed["invariants"].items()
                    if not v["ok"]}
        print(f"  seed {failed['seed']} failed {problems or failed.get('error')}: "
              f"rerun with `{failed['rerun']}`")


if __name__ == "__main__":
    main()
