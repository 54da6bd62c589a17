"""The `bcd` console script: join, node, status, doctor."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from bcd.config import Config, Paths, forget_join_token, joined_config
from bcd.contract.version import version
from bcd.inventory import SIM_VARIANTS
from bcd.inventory.faults import FAULTS
from bcd.join.documents import JoinError, Pins
from bcd.tokens import TokenError, read_token


def _root(args: argparse.Namespace) -> Path:
    return Path(args.root)


def cmd_join(args: argparse.Namespace) -> int:
    from bcd.join.client import join

    if (args.provisioner or args.deploy_listen) and not args.run:
        print("bcd join: --provisioner and --deploy-listen are for the agent: add --run",
              file=sys.stderr)
        return 2
    joined = joined_config(Paths(_root(args)))
    if joined is not None:
        forget_join_token()  # not needed
        print(f"already joined as {joined.node_id}", flush=True)
        return cmd_node(args) if args.run else 0
    try:
        token = read_token(Path(args.token_file) if args.token_file else None)
        forget_join_token()  # read
        config, not_after = join(
            server=args.server, token=token, root=_root(args), sim=args.sim,
            sim_gpus=args.sim_gpus, sim_variant=args.sim_variant, hostname=args.hostname,
            pins=Pins(args.serving_ca_pin, args.join_signing_pin, args.join_encryption_pin),
            gateway_url=args.gateway_url, expect_site=args.expect_site)
    except (TokenError, JoinError) as error:
        print(f"bcd join: {error}", file=sys.stderr)
        return 1
    if args.token_file:
        Path(args.token_file).unlink(missing_ok=True)
    print(f"joined as {config.node_id} (site {config.site_id}, role {config.role}); certificate "
          f"valid until {not_after}", flush=True)
    return cmd_node(args) if args.run else 0


def cmd_node(args: argparse.Namespace) -> int:
    import asyncio

    from bcd.agent import Agent

    config_path = Path(args.config) if args.config else Paths(_root(args)).config_file
    if not config_path.exists() or (args.config is None and
                                    joined_config(Paths(_root(args))) is None):
        print(f"bcd node: {config_path} does not exist: run bcd join first", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config = Config.read(config_path)
    if args.provisioner and config.role != "provisioner":
        print(f"bcd node --provisioner: {config.node_id} joined with a {config.role} token; a "
              "provisioner joins with a token whose role is provisioner", file=sys.stderr)
        return 1
    if args.deploy_listen and not args.provisioner:
        print("bcd node: --deploy-listen is for a provisioner (--provisioner)", file=sys.stderr)
        return 1
    asyncio.run(Agent(config, provisioner=args.provisioner,
                      deploy_listen=args.deploy_listen or "").run())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from bcd.agent import read_status, status_text

    socket_path = Path(args.socket) if args.socket else Paths(_root(args)).socket
    try:
        status = read_status(socket_path)
    except OSError as error:
        print(f"bcd status: cannot reach the agent at {socket_path}: {error.strerror or error}",
              file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if args.json else status_text(status))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from bcd.doctor import run_checks

    return run_checks(Paths(_root(args)), server=args.server, sim=args.sim)


def _gpu_uuid(args: argparse.Namespace) -> str:
    """The UUID of GPU `args.gpu` of the joined machine at `--root`, as it reports it."""
    from bcd.inventory import inventory_for

    config = joined_config(Paths(_root(args)))
    if config is None:
        raise SystemExit("bcd: this machine has not joined (no config under --root)")
    inventory = inventory_for(sim=config.sim, sim_gpus=config.sim_gpus,
                              sim_variant=config.sim_variant, root=str(_root(args).resolve()),
                              hostname=config.hostname or config.node_id)
    for gpu in inventory.report().get("gpus", []):
        if gpu["index"] == args.gpu:
            return str(gpu["uuid"])
    raise SystemExit(f"bcd: there is no GPU {args.gpu}")


def cmd_health_clear(args: argparse.Namespace) -> int:
    """After a GPU was reset: its past XIDs no longer count against its health."""
    from bcd.inventory.nvml import clear_health, cleared_file_of

    uuid = _gpu_uuid(args)
    clear_health(cleared_file_of(_root(args)), uuid)
    print(f"gpu {args.gpu} ({uuid}): past XIDs cleared")
    return 0


def cmd_sim_inject(args: argparse.Namespace) -> int:
    from bcd.inventory.faults import faults_file, inject

    try:
        readings = inject(faults_file(_root(args)), args.gpu, args.fault, args.code or 0)
    except ValueError as refusal:
        print(f"bcd: {refusal}", file=sys.stderr)
        return 2
    if args.fault == "heal":  # a healed simulated GPU was reset: its XIDs are history
        cmd_health_clear(args)
    print(f"gpu {args.gpu}: {json.dumps(readings) if readings else 'healed'} "
          "(the running agent reports it within seconds)")
    return 0


def cmd_sim_agents(args: argparse.Namespace) -> int:
    import asyncio

    from bcd.many import Joining, log_per_machine, run_machines

    roots = [Path(root) for root in args.roots]
    try:
        places = dict(place.split("=", 1) for place in args.place)
    except ValueError:
        print("bcd sim agents: --place takes NAME=rack=R,rail=L", file=sys.stderr)
        return 2
    joining = None
    if any(joined_config(Paths(root)) is None for root in roots):
        pins = (args.serving_ca_pin, args.join_signing_pin, args.join_encryption_pin)
        if not args.server or not all(pins):
            print("bcd sim agents: some machines have not joined: give --server and the three "
                  "pins, and the token in BCD_JOIN_TOKEN or on standard input", file=sys.stderr)
            return 2
        try:
            token = read_token(None)
        except TokenError as error:
            print(f"bcd sim agents: {error}", file=sys.stderr)
            return 1
        prefix = args.hostname_prefix
        joining = Joining(server=args.server, token=token, pins=Pins(*pins),
                          variant=args.sim_variant, gpus=args.sim_gpus, at_once=args.join_at_once,
                          hostname=lambda root: (f"{prefix}-{root.name.removeprefix('node-')}"
                                                 if prefix else None))
    forget_join_token()
    log_per_machine(Path(args.log_dir) if args.log_dir else None)
    try:
        asyncio.run(run_machines(roots, joining=joining, places=places))
    except JoinError as error:
        print(f"bcd sim agents: a machine could not join: {error}", file=sys.stderr)
        return 1
    return 0


def _at_least_one(said: str) -> int:
    try:
        number = int(said)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{said!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} joins at once would join no machine: "
                                         "give 1 or more")
    return number


def _agent_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--provisioner", action="store_true",
                         help="also speak Redfish to this site's machines' BMCs (a node that "
                              "joined with a provisioner token)")
    command.add_argument("--deploy-listen", default=None, metavar="HOST:PORT",
                         help="serve deploy ramdisks their instructions here (an address on "
                              "the machines' management network)")


def print_help(top: argparse.ArgumentParser) -> int:
    top.print_help()
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="bcd", description="better-compute node agent")
    top.add_argument("--version", action="version", version=f"bcd {version()}")
    top.add_argument("--root", default="/", help="host root (a private folder in simulation)")
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("help", help="show this help").set_defaults(
        handler=lambda args: print_help(top))
    join = sub.add_parser("join", help="join the control plane with a join token")
    join.add_argument("--server", required=True, help="https://compute.example.com/api/compute")
    join.add_argument("--serving-ca-pin", required=True)
    join.add_argument("--join-signing-pin", required=True)
    join.add_argument("--join-encryption-pin", required=True)
    join.add_argument("--token-file", help="a 0600 file holding the token; deleted after")
    join.add_argument("--hostname", default=None, help=(
        "the machine's name (default: the host's; with --sim, one derived from --root, so "
        "that machines simulated from several roots are told apart)"))
    join.add_argument("--gateway-url", default=None,
                      help="the gateway to use if the control plane publishes none")
    join.add_argument("--expect-site", default=None,
                      help="refuse a token whose pool is in another site")
    join.add_argument("--sim", action="store_true", help="a simulated machine (tests, dev)")
    join.add_argument("--sim-gpus", type=int, default=8)
    join.add_argument("--sim-variant", choices=SIM_VARIANTS, default="gpu",
                      help="gpu: 8 GPUs on one NVSwitch; gpu-2x4: two NVLink pairs of 4; mig: "
                           "GPUs 0-3 in MIG mode; cpu")
    join.add_argument("--run", action="store_true",
                      help="then run the agent in this process, as bcd node does (a machine "
                           "that joined before just runs): one service joins on its first "
                           "start")
    _agent_options(join)
    join.set_defaults(handler=cmd_join, config=None)
    node = sub.add_parser("node", help="run the agent")
    node.add_argument("--config", default=None)
    _agent_options(node)
    node.set_defaults(handler=cmd_node)
    status = sub.add_parser("status", help="what the running agent says")
    status.add_argument("--json", action="store_true")
    status.add_argument("--socket", default=None)
    status.set_defaults(handler=cmd_status)
    doctor = sub.add_parser("doctor", help="check this host")
    doctor.add_argument("--server", default=None)
    doctor.add_argument("--sim", action="store_true",
                        help="a simulated machine: skip the hardware checks it cannot pass")
    doctor.set_defaults(handler=cmd_doctor)
    sim = sub.add_parser("sim", help="a simulated machine's knobs").add_subparsers(
        dest="sim_command", required=True)
    inject = sim.add_parser("inject", help="inject a GPU fault (xid N, ecc, nvlink-down), set "
                                           "its load (util PERCENT) or heal it, in a running "
                                           "simulated machine")
    inject.add_argument("--gpu", type=int, required=True, help="GPU index")
    inject.add_argument("fault", choices=FAULTS)
    inject.add_argument("code", type=int, nargs="?",
                        help="the XID, for xid (default 79); the percentage, for util")
    inject.set_defaults(handler=cmd_sim_inject)
    agents = sim.add_parser("agents", help="run many simulated machines in this process, one "
                                           "agent each, joining those that have not joined")
    agents.add_argument("roots", nargs="+", metavar="ROOT", help="each machine's root")
    agents.add_argument("--log-dir", default=None,
                        help="each machine's log to <dir>/sim-<root name>.log (default: stderr)")
    agents.add_argument("--place", action="append", default=[], metavar="NAME=PLACE",
                        help="a machine's place in the fabric, e.g. node-01=rack=r1,rail=leaf1")
    agents.add_argument("--server", default=None, help="to join: the control plane's URL")
    agents.add_argument("--serving-ca-pin", default=None)
    agents.add_argument("--join-signing-pin", default=None)
    agents.add_argument("--join-encryption-pin", default=None)
    agents.add_argument("--sim-gpus", type=int, default=8)
    agents.add_argument("--sim-variant", choices=SIM_VARIANTS, default="gpu")
    agents.add_argument("--hostname-prefix", default="",
                        help="joined machines are called <prefix>-<root name without node->")
    agents.add_argument("--join-at-once", type=_at_least_one, default=8,
                        help="joins in flight together (1 or more)")
    agents.set_defaults(handler=cmd_sim_agents)
    health = sub.add_parser("health", help="GPU health").add_subparsers(
        dest="health_command", required=True)
    clear = health.add_parser("clear", help="after resetting a GPU: forget its past XIDs")
    clear.add_argument("--gpu", type=int, required=True, help="GPU index")
    clear.set_defaults(handler=cmd_health_clear)
    return top


def main(argv: list[str] | None = None) -> int:
    args, extra = parser().parse_known_args(argv)
    if extra:
        print(f"bcd: {len(extra)} unexpected argument(s): bcd takes no positional arguments "
              "(a join token is never one: use BCD_JOIN_TOKEN, standard input or "
              "--token-file)", file=sys.stderr)
        return 2
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
