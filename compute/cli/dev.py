"""`better-compute dev`: the whole control plane on this machine, in one command.

It starts an embedded Postgres (throw-away with --memory), migrates, bootstraps the root
tenant and an admin token, a default site and pool, serves the API as `serve` does, runs the
gateway, and with --sim N starts N simulated machines (each a bcd agent with a private root,
all in one process unless --sim-processes) that join through the gateway with a real join
token. Every server runs as a child process; Ctrl-C (or SIGTERM) stops them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import click

from bcd.config import Paths, joined_config
from compute.cli import guestimage
from compute.cli.artifact import served_artifacts, write_artifacts
from compute.cli.client import Client, CliError, Config
from compute.cli.devlock import StateLock
from compute.cli.serve import server_argv
from compute.core import config, pg

READY_TIMEOUT = 60.0
GATEWAY_ROLE = "bc_gateway"
DEV_API_WORKERS = 2


def _django(args: list[str], env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-m", "django", *args], env=env,
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CliError(f"django-admin {args[0]} failed:\n{result.stderr.strip()[-3000:]}")
    return result.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def hold_port(host: str, port: int = 0) -> socket.socket | None:
    """Bind `port` (any free one for 0) without listening, so that no other program's free
    port or outgoing connection takes it while the server meant for it starts; the server
    binds it beside this socket (both reuse the address), then the holder is closed.
    None when the port is taken."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    return sock


def _release(holders: list[socket.socket]) -> None:
    for holder in holders:
        holder.close()


def _gateway_ports(state_dir: Path, host: str,
                   count: int = 1) -> tuple[list[tuple[int, int]], list[socket.socket]]:
    """Each gateway's session and join ports, held until the gateways listen: the last
    run's while they are free (the agents that joined then keep their addresses), else new
    ones, kept for the next run."""
    path = state_dir / "gateway-ports.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        kept = json.loads(path.read_text())
        pairs = [(int(kept["sessions"]), int(kept["joins"])),
                 *((int(s), int(j)) for s, j in kept.get("more", []))][:count]
        held = [hold_port(host, port) for pair in pairs for port in pair]
        holders = [holder for holder in held if holder is not None]
        if len(pairs) == count and len(holders) == len(held):
            return pairs, holders
        _release(holders)
    holders = [holder for _ in range(2 * count) if (holder := hold_port(host))]
    ports = [holder.getsockname()[1] for holder in holders]
    pairs = list(zip(ports[::2], ports[1::2], strict=True))
    path.write_text(json.dumps({"sessions": pairs[0][0], "joins": pairs[0][1],
                                "more": pairs[1:]}))
    return pairs, holders


def _wait_for_port(host: str, port: int, stack: Stack, name: str, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (failure := stack.failure(name)) is not None:
            raise CliError(f"the {what} exited early: {failure}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise CliError(f"the {what} did not listen on {host}:{port} within 30s")


def read_env_file(path: Path) -> dict[str, str]:
    """The exports `dev` wrote (`export KEY='value'` lines)."""
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        values[key] = value.strip("'")
    return values


def _write_env_file(path: Path, lines: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.writelines(f"export {k}='{v}'\n" for k, v in lines.items())


class Stack:
    """The child processes `dev` started, stopped in reverse order.

    Every one is restarted when it dies, as systemd restarts them on real servers: after
    `restart_delay`, doubled for each quick death in a row (at most `restart_max`), so one that
    cannot start does not spin.
    """

    def __init__(self, restart_delay: float = 1.0, log_dir: Path | None = None,
                 restart_max: float = 30.0) -> None:
        self.log_dir = log_dir  # each process's output goes to <log_dir>/<name>.log
        self.restart_delay = restart_delay  # like systemd's RestartSec
        self.restart_max = restart_max
        self.children: list[subprocess.Popen[bytes]] = []
        self.specs: dict[int, tuple[list[str], dict[str, str], str]] = {}
        self.started: dict[int, float] = {}
        self.died: dict[int, float] = {}
        self.quick_deaths: dict[str, int] = {}

    def start(self, argv: list[str], env: dict[str, str], *, name: str) -> subprocess.Popen:
        output: Any = None  # without a log folder: this process's own output (journald)
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = (self.log_dir / f"{name}.log").open("ab")
        # A group of its own: stopping it stops what it started too (the django-q2 cluster's
        # processes outlived it when it was stopped while starting them).
        child = subprocess.Popen(argv, env={**env, "BETTER_COMPUTE_PROCESS": name},
                                 stdout=output, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        if self.log_dir is not None:
            output.close()  # the child has its own descriptor
        self.children.append(child)
        self.specs[child.pid] = (argv, env, name)
        self.started[child.pid] = time.monotonic()
        return child

    def watch(self) -> None:
        for child in list(self.children):
            if child.poll() is None:
                continue
            argv, env, name = self.specs[child.pid]
            died = self.died.setdefault(child.pid, time.monotonic())
            quick = self.quick_deaths.get(name, 0) if died - self.started[child.pid] < 60 else 0
            if time.monotonic() - died < min(self.restart_max, self.restart_delay * 2 ** quick):
                continue
            self.children.remove(child)
            self.quick_deaths[name] = quick + 1
            where = f" (its output: {self.log_dir / f'{name}.log'})" if self.log_dir else ""
            click.echo(f"{name} exited ({child.returncode}); restarting it{where}", err=True)
            self.start(argv, env, name=name)

    def failure(self, name: str) -> str | None:
        """How the newest process called `name` ended (the last line of its output), or None
        while it runs."""
        newest = next((c for c in reversed(self.children) if self.specs[c.pid][2] == name),
                      None)
        if newest is None or newest.poll() is None:
            return None
        log = self.log_dir / f"{name}.log" if self.log_dir else None
        lines = log.read_text(errors="replace").strip().splitlines() if log and log.exists() \
            else []
        return lines[-1] if lines else f"exit status {newest.returncode}"

    def kill(self, name: str, *, env: dict[str, str] | None = None) -> int | None:
        """SIGKILL the running child called `name` (the next `watch` restarts it, with `env`
        when given). Returns its pid, or None when none of that name runs."""
        for child in self.children:
            argv, _env, label = self.specs[child.pid]
            if label == name and child.poll() is None:
                child.kill()
                child.wait()
                if env is not None:
                    self.specs[child.pid] = (argv, env, label)
                return child.pid
        return None

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.poll() is None:
                child.terminate()
        for child in reversed(self.children):
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            with contextlib.suppress(OSError):  # whatever of its group is still there
                os.killpg(child.pid, signal.SIGKILL)


def sim_places(count: int, topology: str) -> list[str]:
    """Each simulated machine's place (`BCD_TOPOLOGY`) for `--sim-topology racks=R,rails=L`:
    machines fill racks in order (r1 first), and each rail (a leaf switch) serves a run of
    neighbouring racks. No places when `topology` is empty."""
    if not topology:
        return []
    try:
        said = {key.strip(): int(value) for key, value in
                (part.split("=", 1) for part in topology.split(","))}
    except ValueError:
        raise click.BadParameter("give racks=N,rails=M (whole numbers)",
                                 param_hint="--sim-topology") from None
    racks, rails = said.get("racks", 1), said.get("rails", 1)
    if set(said) - {"racks", "rails"} or not 1 <= rails <= racks:
        raise click.BadParameter("give racks=N,rails=M with 1 <= M <= N",
                                 param_hint="--sim-topology")
    places = []
    for index in range(count):
        rack = index * racks // max(count, 1)
        places.append(f"rack=r{rack + 1},rail=leaf{rack * rails // racks + 1}")
    return places


def _simulate(stack: Stack, api: Client, *, count: int, variant: str, pool_id: str,
              server: str, state_dir: Path, env: dict[str, str],
              after_join: Callable[[], None], topology: str = "",
              processes: bool = False) -> None:
    """Start `count` simulated machines (those that joined in an earlier run keep their
    identity; the others join through the gateway) and wait until each is adopted with a
    live session. All of them run in one process (`bcd sim agents`, supervised as
    `sim-agents`), or with `processes` each in its own (`sim-<root>`), as on real hosts.
    `after_join` runs once they all joined (so they are listed before what it joins)."""
    roots = [state_dir / "sim" / f"node-{n:02d}" for n in range(1, count + 1)]
    places = dict(zip(roots, sim_places(count, topology), strict=False))

    def sessions() -> dict[str, tuple[int, str, str]]:
        nodes = api.call("nodes.list", {"poolId": pool_id, "limit": 1000})["items"]
        return {n["id"]: (n["sessionEpoch"], n["provisionState"], n["connectivity"])
                for n in nodes}

    before = sessions()  # a node left `connected` by the last run has no session yet

    newcomers = [root for root in roots if joined_config(Paths(root)) is None]
    if not processes:
        start_machines(stack, api, roots, newcomers, variant=variant, pool_id=pool_id,
                       server=server, env=env, places=places)
        until_joined(stack, newcomers, process="sim-agents")
    else:
        for root in roots:
            if root not in newcomers:
                stack.start([sys.executable, "-m", "bcd", "--root", str(root), "node"],
                            placed(agent_environment(env), places.get(root)),
                            name=f"sim-{root.name}")
        if newcomers:  # each joins, then runs, in one process
            start_joining(stack, api, newcomers, variant=variant, pool_id=pool_id,
                          server=server, env=env, places=places)
            until_joined(stack, newcomers)
    after_join()
    ours = {config.node_id for root in roots if (config := joined_config(Paths(root)))}
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        stack.watch()
        live = [node_id for node_id, (epoch, state, connectivity) in sessions().items()
                if node_id in ours and epoch > before.get(node_id, (0,))[0]
                and state == "adopted" and connectivity == "connected"]
        if len(live) >= count:
            click.echo(f"{count} simulated node(s) adopted and connected")
            return
        time.sleep(0.3)
    raise CliError(f"the simulated nodes were not adopted and connected within "
                   f"{READY_TIMEOUT:.0f}s")


def start_machines(stack: Stack, api: Client, roots: list[Path], newcomers: list[Path], *,
                   variant: str, pool_id: str, server: str, env: dict[str, str],
                   places: dict[Path, str], name: str = "sim-agents") -> None:
    """Run every machine at `roots` in one process, `bcd sim agents` (the `newcomers` join
    first, with one new join token), supervised by `stack` as `name`: each machine's log
    goes to `sim-<root>.log` all the same."""
    argv = [sys.executable, "-m", "bcd", "sim", "agents", *map(str, roots)]
    if stack.log_dir is not None:
        argv += ["--log-dir", str(stack.log_dir)]
    for root, place in places.items():
        argv += ["--place", f"{root.name}={place}"]
    agent_env = agent_environment(env)
    if newcomers:
        token, pins = _join_grant(api, pool_id, uses=len(newcomers), role="node")
        argv += ["--server", server, *pins, "--sim-variant", variant,
                 "--hostname-prefix", _hostname_prefix(variant)]
        agent_env = agent_environment(env, join_token=token)
    stack.start(argv, agent_env, name=name)


def _join_grant(api: Client, pool_id: str, *, uses: int, role: str) -> tuple[str, list[str]]:
    """A new join token for `uses` machines of `pool_id`, and the pins' options that `bcd`
    joins with."""
    minted = api.call("joinTokens.create", {"poolId": pool_id, "ttl": 3_600_000,
                                            "maxUses": uses, "role": role})
    pins = api.call("pki.show")
    return minted["token"], ["--serving-ca-pin", pins["servingCaSpkiPin"],
                             "--join-signing-pin", pins["joinSigningKeyPin"],
                             "--join-encryption-pin", pins["joinEncryptionKeyPin"]]


def _hostname_prefix(variant: str) -> str:
    return "cpu" if variant == "cpu" else "gpu"


def agent_environment(env: dict[str, str], *, join_token: str = "") -> dict[str, str]:
    """What a simulated machine's agent runs with: the stack's environment without the
    database URL or the control plane's secrets (an agent speaks only to the gateway), and
    a join token only when it is to join."""
    kept = {name: value for name, value in env.items() if name != "DATABASE_URL"
            and name != "BCD_JOIN_TOKEN" and not name.startswith("BETTER_COMPUTE_")}
    return {**kept, "BCD_JOIN_TOKEN": join_token} if join_token else kept


def join_argvs(api: Client, roots: list[Path], *, variant: str, pool_id: str, server: str,
               env: dict[str, str], role: str = "node") -> tuple[dict[str, str], list[list[str]]]:
    """One new join token for `roots`, in the environment the joins run with, and the
    `bcd join` command line of a simulated machine at each root."""
    token, pins = _join_grant(api, pool_id, uses=len(roots), role=role)
    argv = []
    for root in roots:
        root.mkdir(parents=True, exist_ok=True)
        hostname = (role if role != "node" else
                    f"{_hostname_prefix(variant)}-{root.name.removeprefix('node-')}")
        argv.append([sys.executable, "-m", "bcd", "--root", str(root), "join", "--server",
                     server, *pins, "--sim", "--sim-variant", variant, "--hostname", hostname])
    return agent_environment(env, join_token=token), argv


def placed(env: dict[str, str], place: str | None) -> dict[str, str]:
    """An agent's environment with its place in the fabric, when it has one."""
    return {**env, "BCD_TOPOLOGY": place} if place else env


def start_joining(stack: Stack, api: Client, roots: list[Path], *, variant: str,
                  pool_id: str, server: str, env: dict[str, str], role: str = "node",
                  options: tuple[str, ...] = (), places: dict[Path, str] | None = None
                  ) -> None:
    """Start a simulated machine at each root that joins and then runs its agent in the same
    process (`bcd join --run`), supervised by `stack` as `sim-<root>` (the provisioner's
    as `provisioner`); a restart finds it joined and just runs."""
    agent_env, argv = join_argvs(api, roots, variant=variant, pool_id=pool_id,
                                 server=server, env=env, role=role)
    for root, command in zip(roots, argv, strict=True):
        stack.start([*command, "--run", *options], placed(agent_env, (places or {}).get(root)),
                    name=f"sim-{root.name}" if role == "node" else role)


def until_joined(stack: Stack, roots: list[Path], role: str = "node",
                 timeout: float = 60.0, process: str = "") -> None:
    """Until each machine started by `start_joining` (or by `start_machines`, all in the
    `process` named) has joined; a join that fails says why."""
    deadline = time.monotonic() + timeout
    waiting = list(roots)
    while waiting:
        waiting = [root for root in waiting if joined_config(Paths(root)) is None]
        for root in waiting:
            failure = stack.failure(process or (f"sim-{root.name}" if role == "node" else role))
            if failure is not None:
                raise CliError(f"a simulated agent could not join: {failure}")
        if waiting and time.monotonic() > deadline:
            raise CliError(f"a simulated agent did not join within {timeout:.0f}s")
        time.sleep(0.05)


def join_simulated(api: Client, roots: list[Path], *, variant: str, pool_id: str,
                   server: str, env: dict[str, str], role: str = "node",
                   timeout: float = 60.0) -> None:
    """Join a machine at each root (all at once) with one new join token, without running
    it. A join that fails, or does not end within `timeout` seconds, stops the others."""
    agent_env, argv = join_argvs(api, roots, variant=variant, pool_id=pool_id,
                                 server=server, env=env, role=role)
    joins = [subprocess.Popen(command, env=agent_env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for command in argv]
    waiting = list(joins)
    deadline = time.monotonic() + timeout
    try:
        while waiting:
            for process in list(waiting):
                if process.poll() is None:
                    continue
                waiting.remove(process)
                out, err = process.communicate()
                if process.returncode != 0:
                    raise CliError("a simulated agent could not join: "
                                   + exit_reason(process.returncode, out, err))
            if waiting and time.monotonic() > deadline:
                raise CliError(f"a simulated agent did not join within {timeout:.0f}s")
            time.sleep(0.02)
    finally:
        for process in waiting:  # the others, when one failed or time ran out
            process.kill()
            process.wait()


def exit_reason(code: int, out: bytes, err: bytes) -> str:
    """Why a process ended badly: its exit status or signal, and what it last said (its
    error output, else its output)."""
    said = (err.decode(errors="replace").strip() or out.decode(errors="replace").strip())
    status = (f"killed by {signal.Signals(-code).name}" if code < 0
              else f"exit status {code}")
    return f"{status}: {said[-2000:]}" if said else f"{status}, saying nothing"


def _gateway_password(state_dir: Path) -> Path:
    """The file holding the gateway's database password (made once, kept with the state)."""
    password_file = state_dir / "gateway-db-password"
    if not password_file.exists():
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(24))
    return password_file


def _gateway_env(env: dict[str, str], state_dir: Path) -> dict[str, str]:
    """The gateway's environment: its own database role (bc_dev_setup made it) and no
    key-encryption key."""
    password_file = _gateway_password(state_dir)
    url = urlsplit(env["DATABASE_URL"])
    host = url.netloc.rpartition("@")[2]
    netloc = f"{GATEWAY_ROLE}:{quote(password_file.read_text().strip(), safe='')}@{host}"
    return {**{k: v for k, v in env.items() if not k.startswith("BETTER_COMPUTE_KEK")},
            "DATABASE_URL": urlunsplit(url._replace(netloc=netloc)),
            "BETTER_COMPUTE_WITHOUT_KEK": "1"}


def _provisioner_start(stack: Stack, api: Client, *, pool_id: str, server: str,
                       state_dir: Path, env: dict[str, str], deploy_listen: str
                       ) -> tuple[str, int]:
    """Start the site's provisioner: a real bcd (`node --provisioner`) that speaks Redfish to
    the BMCs of machines enrolled with `nodes enroll`, and serves deploy ramdisks their
    instructions on `deploy_listen`. It joins once and keeps its identity. Returns its node
    id and its session epoch before this start."""
    root = state_dir / "provisioner"
    options = ("--provisioner", "--deploy-listen", deploy_listen)
    if joined_config(Paths(root)) is None:  # it joins, then runs, in one process
        start_joining(stack, api, [root], variant="cpu", pool_id=pool_id, server=server,
                      env=env, role="provisioner", options=options)
        until_joined(stack, [root], role="provisioner")
        before = 0
    else:
        before = api.call("nodes.get", {"nodeId": _node_id(root)})["sessionEpoch"]
        stack.start([sys.executable, "-m", "bcd", "--root", str(root), "node", *options],
                    agent_environment(env),
                    name="provisioner")
    return _node_id(root), before


def _node_id(root: Path) -> str:
    config = joined_config(Paths(root))
    if config is None:
        raise CliError(f"the machine at {root} has not joined: it holds no config")
    return config.node_id


def _provisioner_wait(stack: Stack, api: Client, node_id: str, before: int) -> None:
    """Until the provisioner has a session with this run's gateway."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        stack.watch()
        node = api.call("nodes.get", {"nodeId": node_id})
        if node["sessionEpoch"] > before and node["connectivity"] == "connected":
            click.echo(f"provisioner {node['id']} of site {node['siteId']} connected "
                       "(it speaks Redfish to the BMCs of enrolled machines)")
            return
        time.sleep(0.3)
    raise CliError(f"the provisioner did not connect within {READY_TIMEOUT:.0f}s")


def default_image(api: Client, pool_ids: list[str], downloads: Path,
                  base_url: str) -> dict[str, str]:
    """Build the small sandbox image (a distribution kernel and a busybox initramfs) into
    the downloads folder, add it as `default` to each pool that has no image yet, and
    return the exports naming its files."""
    try:
        parts = guestimage.build(downloads / "guest")
    except OSError as missing:  # no kernel or busybox, or a root-only kernel in /boot
        click.echo(f"no sandbox image (sandboxes cannot boot): {missing}", err=True)
        return {}
    bare = [pool for pool in pool_ids if not api.call("images.list", {"poolId": pool})["items"]]
    body: dict[str, Any] = {"name": "default", "readyLine": guestimage.BOOT_LINE}
    for part, path in parts.items():
        served = downloads / f"guest-{path.name}"
        path.replace(served)
        body[part] = {"url": f"{base_url}/downloads/{served.name}",
                      "sha256": guestimage.sha256_of(served)}
    agent = bool(guestimage.agent_files())
    for pool in bare:
        api.call("images.create", {**body, "poolId": pool})
        if agent:  # the same image, started from a snapshot of its booted guest
            api.call("images.create", {**body, "poolId": pool, "name": "snapshot",
                                       "snapshot": True})
    click.echo(f"sandbox images default{' and snapshot' if agent else ''}: "
               f"{guestimage.find_kernel().name} and a busybox initramfs"
               f"{' with qemu-ga' if agent else ' (no qemu-guest-agent: no exec)'}, "
               f"added to {len(bare)} pool(s)")
    return {"GUEST_KERNEL": str(downloads / "guest-vmlinuz"),
            "GUEST_INITRD": str(downloads / "guest-initrd.gz")}


# Also in the tutorial (docs/tutorial.md), which a test runs as written.
JOIN_ONE_MORE = """\
  better-compute join-tokens create --pool $POOL --ttl 1h --out ./join-token
  bcd --root ./machine-1 join --server "$BETTER_COMPUTE_URL" --sim --token-file ./join-token \\
    --serving-ca-pin "$(better-compute pki show --query servingCaSpkiPin)" \\
    --join-signing-pin "$(better-compute pki show --query joinSigningKeyPin)" \\
    --join-encryption-pin "$(better-compute pki show --query joinEncryptionKeyPin)"
  bcd --root ./machine-1 node > ./machine-1.log 2>&1 &"""


class DatabaseWatch:
    """`dev`'s embedded Postgres, restarted when its postmaster dies as the other children
    are (after `restart_delay`, doubled for each failed start in a row, at most
    `restart_max`): the API, the gateway and the workers reconnect by themselves."""

    def __init__(self, server: pg.EmbeddedPostgres, restart_delay: float = 1.0,
                 restart_max: float = 30.0) -> None:
        self.server = server
        self.restart_delay, self.restart_max = restart_delay, restart_max
        self.died: float | None = None
        self.failed_starts = 0

    def watch(self) -> None:
        if self.server.postmaster_alive():
            self.died = None  # (started again by someone else meanwhile)
            return
        import psycopg  # only once it died: the CLI starts without it

        now = time.monotonic()
        if self.died is None:
            self.died = now
            click.echo("Postgres exited; restarting it", err=True)
        if now - self.died < min(self.restart_max, self.restart_delay * 2 ** self.failed_starts):
            return
        try:
            self.server.start()  # crash recovery replays what was committed
        except (RuntimeError, OSError, psycopg.Error):  # its old processes may still hold on
            self.died, self.failed_starts = now, self.failed_starts + 1
            return
        click.echo(f"Postgres restarted in {self.server.data_dir}", err=True)
        self.died, self.failed_starts = None, 0


@dataclass
class ControlPlane:
    """What `start_control_plane` started: the environment its processes share, the ids
    `bc_dev_setup` made, the API's URL and an admin client, and the gateway's ports."""

    env: dict[str, str]
    ids: dict[str, Any]
    url: str
    api: Client
    gateway_port: int
    join_port: int
    downloads: Path


def start_throwaway() -> tuple[pg.EmbeddedPostgres, bool]:
    """A throw-away embedded Postgres, started from the migrated copy when there is one;
    True when it was (it needs no migration)."""
    copy = pg.migrated_copy()
    seeded = copy.exists() and not config.is_set("DATABASE_URL")
    return pg.throwaway().start(seed=copy if seeded else None), seeded


def _save_migrated_copy(server: pg.EmbeddedPostgres) -> None:
    """Keep this freshly migrated cluster for the next `dev --memory`, and drop the copies
    of older schemas."""
    copy = pg.migrated_copy()
    copy.parent.mkdir(parents=True, exist_ok=True)
    server.save_copy(copy)
    for old in copy.parent.iterdir():
        if not old.name.startswith(copy.name):
            shutil.rmtree(old, ignore_errors=True)


def start_more_workers(stack: Stack, env: dict[str, str]) -> None:
    """The second queue worker and the django-q2 cluster (its jobs are periodic)."""
    stack.start([sys.executable, "-m", "django", "bc_worker", "--loop"], env, name="worker-2")
    stack.start([sys.executable, "-m", "django", "qcluster"],
                {**env, "BETTER_COMPUTE_Q_WORKERS": "1"}, name="qcluster")
    click.echo("Workers running: 2 queue workers (256 shards: reservations, pools, node "
               "liveness) and the django-q2 cluster (audit positions each minute, checkpoints "
               "each hour)")


def start_control_plane(stack: Stack, server: pg.EmbeddedPostgres, *, host: str, port: int,
                        state_dir: Path, sim_variant: str = "gpu", seeded: bool = False,
                        env_extra: dict[str, str] | None = None,
                        one_worker: bool = False, gateways: int = 1) -> ControlPlane:
    """Migrate (unless the server was `seeded` from a migrated copy), bootstrap the root
    tenant, its admin token, a site and a pool, and start the API (as `serve` runs it), the
    gateway, two queue workers and the django-q2 cluster as children of `stack` (with
    `one_worker`, one queue worker that also runs the periodic jobs: on a laptop's cores a
    second worker and the cluster's five processes add memory, not speed). `env_extra` goes
    to every one of them.
    With `gateways` > 1, as many gateways (`gateway-2`, …), every one published."""
    stack.log_dir = state_dir / "logs"
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    api_holder = hold_port(host, port)  # free when asked for; kept so until the API listens
    ports, gateway_holders = _gateway_ports(state_dir, host, gateways)
    (gateway_port, join_port) = ports[0]
    downloads = Path(config.text("BETTER_COMPUTE_DOWNLOADS_DIR") or state_dir / "downloads")
    write_artifacts(downloads)  # the agent's wheel; executables that were built stay
    env = {**config.environment(**(env_extra or {})),
           "DATABASE_URL": config.text("DATABASE_URL") or server.url,
           "DJANGO_SETTINGS_MODULE": "compute.project.settings",
           "BETTER_COMPUTE_DOWNLOADS_DIR": str(downloads),
           "BETTER_COMPUTE_GATEWAY_URL": ",".join(f"grpcs://{host}:{sessions}"
                                                   for sessions, _joins in ports),
           "BETTER_COMPUTE_GATEWAY_JOIN_URL": f"grpcs://{host}:{join_port}"}
    if seeded:
        click.echo("migrations applied (a copy of a migrated cluster)", err=True)
    else:
        click.echo("migrating …", err=True)
        _django(["migrate", "--no-input"], env)
        if server.throwaway and not config.is_set("DATABASE_URL"):
            _save_migrated_copy(server)
    # The API as `serve` runs it (a short drain keeps Ctrl-C quick); its workers start
    # while the set-up below runs.
    stack.start(server_argv(host, port, workers=DEV_API_WORKERS, graceful_timeout=5), env,
                name="api")
    token_file = state_dir / "admin-token"
    setup_args = ["bc_dev_setup", "--token-file", str(token_file),
                  "--gateway-role-password-file", str(_gateway_password(state_dir)),
                  "--gateway-credentials", str(state_dir / "gateway"),
                  "--gateway-host", host, "--gateway-host", "localhost"]
    if sim_variant == "cpu":
        setup_args.append("--cpu-pool")
    if sim_variant == "mig":  # MIG instances, and shares of the other GPUs
        setup_args += ["--slice-gpus", "4"]
    ids: dict[str, Any] = json.loads(_django(setup_args, env).strip().splitlines()[-1])
    gateway_env = _gateway_env(env, state_dir)
    _wait_for_port(host, port, stack, "api", "API server")
    _release([api_holder] if api_holder else [])
    url = f"http://{host}:{port}/api/compute"
    for number, (sessions, joins) in enumerate(ports, start=1):
        name = "gateway" if number == 1 else f"gateway-{number}"
        stack.start(
            [sys.executable, "-m", "gateway", "--listen", f"{host}:{sessions}",
             "--join-listen", f"{host}:{joins}", "--api-url", f"http://{host}:{port}",
             "--cert-dir", str(state_dir / "gateway"), "--name", name], gateway_env,
            name=name)
        _wait_for_port(host, joins, stack, name, name)
    _release(gateway_holders)
    stack.start([sys.executable, "-m", "django", "bc_worker", "--loop",
                 *(["--periodic"] if one_worker else [])], env, name="worker-1")
    if one_worker:
        click.echo("Worker running: one queue worker (256 shards: reservations, pools, node "
                   "liveness) that also runs the periodic jobs (audit positions each minute, "
                   "checkpoints each hour)")
    else:
        start_more_workers(stack, env)
    api = Client(Config(url=url, token=token_file.read_text().strip(), tenant=None))
    return ControlPlane(env=env, ids=ids, url=url, api=api, gateway_port=gateway_port,
                        join_port=join_port, downloads=downloads)


@click.command("dev")
@click.option("--memory", is_flag=True, help="Use a throw-away database, deleted on exit.")
@click.option("--port", type=int, default=3000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--sim", "sim", type=click.IntRange(0, 256), default=0,
              help="Simulated machines (bcd agents) to join through the gateway.")
@click.option("--sim-variant", type=click.Choice(["gpu", "gpu-2x4", "mig", "cpu"]),
              default="gpu", show_default=True,
              help="gpu: 8 GPUs on one NVSwitch domain (HGX); gpu-2x4: two NVLink domains of "
              "4; mig: the HGX with GPUs 0-3 in MIG mode (seven 1g.10gb, or two 3g.40gb) and the "
              "others sliced in 4 shares; "
              "cpu: machines without GPUs (and a CPU pool).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the token, env file, gateway credentials and agents go.")
@click.option("--gateways", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Gateways to run; agents spread over them and move when one stops.")
@click.option("--sim-processes", is_flag=True,
              help="Run each simulated machine's agent in a process of its own, as on real "
              "hosts (by default one process runs them all).")
@click.option("--sim-topology", default="", metavar="racks=N,rails=M",
              help="Place the simulated machines in N racks under M rails (leaf switches), "
              "as rack and rail labels the gang placer packs multi-node reservations by.")
def dev(memory: bool, port: int, host: str, sim: int, sim_variant: str,
        state_dir: Path | None, gateways: int, sim_processes: bool, sim_topology: str) -> None:
    """Run the control plane locally: Postgres, API, gateway, simulated machines."""
    began = time.monotonic()
    sim_places(sim, sim_topology)  # a bad --sim-topology is refused before anything starts
    signal.signal(signal.SIGTERM, _interrupted)  # TERM while starting: stop what started
    state_dir = state_dir or pg.state_root() / "dev"
    lock = StateLock(state_dir)  # before anything is started or touched
    click.echo("starting embedded Postgres …", err=True)
    stack = Stack(restart_delay=config.number("BETTER_COMPUTE_DEV_RESTART_SECONDS"))
    env_file: Path | None = None
    kept = None if memory else pg.persistent()
    started_here = kept is None or not kept.is_running()  # a kept server already running stays
    server, seeded = start_throwaway() if kept is None else (kept.start(), False)
    try:
        click.echo(f"embedded Postgres runs in {server.data_dir}", err=True)
        if memory:  # a new database: machines that joined an earlier one are unknown to it
            forget_machines(state_dir)
        plane = start_control_plane(stack, server, host=host, port=port, state_dir=state_dir,
                                    sim_variant=sim_variant, seeded=seeded, one_worker=True,
                                    gateways=gateways)
        env, ids, url, api = plane.env, plane.ids, plane.url, plane.api
        join_port = plane.join_port
        downloads, artifacts = plane.downloads, served_artifacts(plane.downloads)
        # The sandbox image is built (and added) while the machines join and connect.
        images = ThreadPoolExecutor(max_workers=1)
        guest_built = images.submit(default_image, Client(api.config),
                                    [ids[k] for k in ("poolId", "cpuPoolId") if k in ids],
                                    downloads, f"http://{host}:{port}")
        images.shutdown(wait=False)
        started: list[tuple[str, int]] = []
        deploy_listen = f"{host}:{free_port()}"

        def start_provisioner() -> None:  # it joins after the machines, runs beside them
            started.append(_provisioner_start(stack, api, pool_id=ids.get("cpuPoolId") or
                                              ids["poolId"], server=url, state_dir=state_dir,
                                              env=env, deploy_listen=deploy_listen))

        if sim:
            _simulate(stack, api, count=sim, variant=sim_variant,
                      pool_id=ids.get("cpuPoolId") or ids["poolId"], server=url,
                      state_dir=state_dir, env=env, after_join=start_provisioner,
                      topology=sim_topology, processes=sim_processes)
        else:
            start_provisioner()
        _provisioner_wait(stack, api, *started[0])
        guest = guest_built.result()
        exports = {"BETTER_COMPUTE_URL": url, "BETTER_COMPUTE_TOKEN": api.config.token,
                   "BETTER_COMPUTE_TENANT": "root", "POOL": ids["poolId"],
                   "SITE": ids["siteId"], "DATABASE_URL": env["DATABASE_URL"],
                   "DEPLOY_URL": f"http://{deploy_listen}/v1/deploy"}
        if "cpuPoolId" in ids:
            exports["CPU_POOL"] = ids["cpuPoolId"]
        exports.update(guest)
        env_file = state_dir / "env"
        _write_env_file(env_file, exports)
        lock.record(pid=os.getpid(), url=url)
        click.echo(ready_line(time.monotonic() - began, machines=sim))
        click.echo(f"better-compute listening on {url}")
        click.echo(f"console on http://{host}:{port}/console/ (sign in with the API token in "
                   "the env file)")
        for sessions in plane.env["BETTER_COMPUTE_GATEWAY_URL"].split(","):
            click.echo(f"gateway on {sessions.removeprefix('grpcs://')} (sessions)")
        click.echo(f"joins on {host}:{join_port}")
        click.echo(f"each process writes its output to {stack.log_dir}/<name>.log")
        for name, digest in artifacts.items():
            click.echo(f"agent artifact: http://{host}:{port}/downloads/{name} sha256 {digest}")
        click.echo(f"exports written to {env_file} (mode 0600); in another shell run:")
        click.echo(f"  . {env_file}")
        click.echo("to join one more simulated machine to a pool ($POOL) with a join token:")
        click.echo(JOIN_ONE_MORE)
        if memory and not config.is_set("DATABASE_URL"):  # for the next run to start from
            threading.Thread(target=pg.make_spare, args=(pg.migrated_copy(),),
                             daemon=True).start()
        stop = _catch_stop_signals()  # before the line that invites them
        click.echo("Ctrl-C stops everything.")
        database = DatabaseWatch(server, stack.restart_delay) if started_here else None
        _wait_for_signal(stop, stack, database)
    finally:
        stack.stop()
        power_off_simulated_vms(state_dir)
        if env_file is not None:  # it names a server that is gone now
            env_file.unlink(missing_ok=True)
        if started_here:
            server.stop()
        lock.release()
        click.echo("stopped", err=True)


def ready_line(seconds: float, *, machines: int) -> str:
    """How long `dev` took to be ready, with what the machine was doing meanwhile: the same
    start takes several times longer on a busy machine."""
    load = os.getloadavg()[0]
    return (f"ready in {seconds:.1f} s with {machines} simulated machine(s) (load average "
            f"{load:.1f} on {os.cpu_count() or 1} cores)")


def forget_machines(state_dir: Path) -> None:
    """Drop the identities of the simulated machines and the provisioner (their VMs off)."""
    power_off_simulated_vms(state_dir)
    for folder in ("sim", "provisioner"):
        shutil.rmtree(state_dir / folder, ignore_errors=True)


def power_off_simulated_vms(state_dir: Path) -> None:
    """The simulated machines go down with `dev`, and so do the VMs they ran (a real
    agent that stops leaves its VMs running; these would outlive their machine)."""
    for pidfile in (state_dir / "sim").glob("*/var/lib/bcd/vms/*/qemu.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _catch_stop_signals() -> threading.Event:
    """From here on INT and TERM ask for an orderly stop instead of interrupting."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _wait_for_signal(stop: threading.Event, stack: Stack,
                     database: DatabaseWatch | None = None) -> None:
    while not stop.is_set():
        if database is not None:
            database.watch()
        stack.watch()
        time.sleep(0.2)
