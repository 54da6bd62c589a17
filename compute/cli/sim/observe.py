"""What the simulator reads to judge a run: the machines' own files, the IAM decision log,
and the ledger (through `bc_invariants`, which runs in the control plane's code)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bcd.config import Paths, joined_config

FLEET_ORIGINS_EXCLUDE = ("api",)  # the tenants' API calls are decided; nothing else may be


def commands_run_twice(roots: list[Path]) -> tuple[list[str], int]:
    """I2: commands a machine's execution log shows started more than once, and how many
    executions the logs hold in all (the check looked at something)."""
    twice, total = [], 0
    for root in roots:
        log = Paths(root).state_dir / "executions.log"
        if not log.exists():
            continue
        runs = Counter(json.loads(line)["command"] for line in log.read_text().splitlines()
                       if line.strip())
        total += sum(runs.values())
        twice += [f"{root.name} ran {command} {n} times" for command, n in runs.items()
                  if n > 1]
    return twice, total


def iam_decisions(log: Path) -> Counter[str]:
    """IAM decisions by the process that asked for them."""
    if not log.exists():
        return Counter()
    return Counter(json.loads(line)["origin"] for line in log.read_text().splitlines()
                   if line.strip())


def ledger_checks(env: dict[str, str], roots: list[Path], joined: list[str],
                  settle: float = 10.0) -> dict[str, Any] | None:
    """The ledger's invariants (I1, I3, I4, I5) with the holds of the machines at `roots`,
    or None when the database cannot answer (it is restarting)."""
    machines = {config.node_id: str(root) for root in roots
                if (config := joined_config(Paths(root))) is not None}
    result = subprocess.run([sys.executable, "-m", "django", "bc_invariants"], env=env,
                            input=json.dumps({"machines": machines,
                                              "joined": joined, "settleSeconds": settle}),
                            capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        return None
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found
