"""`better-compute sim run`: one seed of the fleet simulator, printed as it goes."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from compute.cli.sim.schedule import FAULTS

if TYPE_CHECKING:
    from compute.cli.sim.run import Report

WITHOUT = ("exclude", "journal", "fence")


@click.group("sim")
def sim() -> None:
    """The fleet simulator: the real control plane and agents under a seed's faults."""


@sim.command("run")
@click.option("--seed", type=int, required=True, help="Derives the workload and every fault.")
@click.option("--nodes", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--minutes", type=click.FloatRange(0.5, 600), default=10, show_default=True,
              help="Simulated minutes.")
@click.option("--time-scale", type=click.FloatRange(1, 10), default=10, show_default=True,
              help="Simulated seconds per real second (heartbeats, leases and timeouts "
              "shrink with it; at most 10, as heartbeats are whole seconds).")
@click.option("--without", type=click.Choice(WITHOUT), multiple=True,
              help="Break a guarantee on purpose (drop the EXCLUDE constraints and the "
              "services' recheck of them, agents that ignore their journal, or a pool that "
              "only notifies at a hold's end) to show that I1, I2 or I6 then fails.")
@click.option("--faults", "only", type=click.Choice(FAULTS), multiple=True,
              help="Inject only these kinds of fault, in turn, at the seed's fault times "
              "(e.g. --faults postgres-restart --faults postgres-kill: Postgres again and "
              "again all run long).")
@click.option("--converge-within", type=click.FloatRange(1, 3600), default=90,
              show_default=True, help="Real seconds after the last fault for I3 to hold.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the run's processes' logs, the machines' files and a stopped "
              "copy of the database (`postgres/`) here.")
@click.option("--sim-topology", "topology", default="racks=2,rails=1", show_default=True,
              metavar="racks=N,rails=M",
              help="The machines' racks and rails (labels the gang placer packs by).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def sim_run(seed: int, nodes: int, minutes: float, time_scale: float, without: tuple[str, ...],
            only: tuple[str, ...], converge_within: float, state_dir: Path | None,
            topology: str, output: str) -> None:
    """Run one seed; exit 1 when an invariant fails."""
    from compute.cli.dev import sim_places
    from compute.cli.sim.run import Options, run  # the database driver, for `sim run` alone

    quiet = output == "json"
    with contextlib.redirect_stdout(sys.stderr) if quiet else contextlib.nullcontext():
        report = run(Options(seed=seed, nodes=nodes, minutes=minutes, time_scale=time_scale,
                             without=frozenset(without), only=only, state_dir=state_dir,
                             converge_within=converge_within,
                             places=tuple(sim_places(nodes, topology))),
                     echo=(lambda _line: None) if quiet else click.echo)
    if quiet:
        click.echo(json.dumps(report_dict(report)))
    else:
        show(report, rerun=f"better-compute sim run --seed {seed} --nodes {nodes} "
                           f"--minutes {minutes:g} --time-scale {time_scale:g}"
                           f" --sim-topology {topology}"
                           + "".join(f" --without {w}" for w in without)
                           + "".join(f" --faults {f}" for f in only))
    if not report.passed:
        raise SystemExit(1)


def report_dict(report: Report) -> dict[str, object]:
    return {"seed": report.seed, **report.options, "passed": report.passed,
            "seconds": report.seconds, "faults": report.faults, "outcomes": report.outcomes,
            "invariants": report.invariants}


def show(report: Report, rerun: str) -> None:
    for name, result in report.invariants.items():
        click.echo(f"{name:>4} {'PASS' if result['ok'] else 'FAIL'}  {result['summary']}")
        for problem in result["problems"]:
            click.echo(f"        {problem}")
    done = ", ".join(f"{k}: {v}" for k, v in sorted(report.outcomes.items()))
    click.echo(f"operations: {done}")
    click.echo(f"seed {report.seed} {'passed' if report.passed else 'FAILED'} in "
               f"{report.seconds:.0f} s real; the same faults again: {rerun}")
