"""Where bcd keeps things, its config.toml, and its tuning.

Every host path hangs off a root ("/" on a real server, a private directory for simulated
agents), so many simulated agents can run side by side without touching the real /etc.
Environment variables (all `BCD_…`, and systemd's) are declared and read here, once, when
the agent starts (`VARIABLES`: the settings reference is generated from it).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import ModuleType

from bcd.contract.variables import Declared, Variable

AGENT = "agent"
VARIABLES = Declared(
    Variable("BCD_JOIN_TOKEN", "str", None,
             "the join token `bcd join` spends (never an argument; removed from the "
             "environment once read)", reader=AGENT, secret=True),
    Variable("BCD_RENEW_MARGIN_HOURS", "float", 8.0,
             "renew the node certificate once this little of its 24 h is left", reader=AGENT),
    Variable("BCD_RENEW_CHECK_SECONDS", "float", 300.0,
             "how often to look at the certificate's expiry", reader=AGENT),
    Variable("BCD_INVENTORY_CHECK_SECONDS", "float", 2.0,
             "how often to read inventory and health (sent when they change)", reader=AGENT),
    Variable("BCD_TELEMETRY_SECONDS", "float", 30.0,
             "how often GPU utilization is sent (idle reclaim reads it)", reader=AGENT),
    Variable("BCD_BACKOFF_MAX_SECONDS", "float", 30.0,
             "the longest wait between two attempts to reach the gateway (jittered)",
             reader=AGENT),
    Variable("BCD_VM_BOOT_TIMEOUT_SECONDS", "float", 180.0,
             "a sandbox VM that has not said it booted by then fails", reader=AGENT),
    Variable("BCD_VM_SHUTDOWN_SECONDS", "float", 20.0,
             "ACPI shutdown's grace before QEMU is told to quit", reader=AGENT),
    Variable("BCD_VIRTUALIZATION", "str", None,
             "the accelerator sandbox VMs use (`kvm`, `tcg` or `none`), instead of probing "
             "the host", reader=AGENT),
    Variable("BCD_DEVICE_PLUGIN_DIR", "path", None,
             "the kubelet's device-plugin folder (default "
             "`/var/lib/kubelet/device-plugins`)", reader=AGENT),
    Variable("SLURM_CONF", "path", None,
             "the site's slurm.conf, which the slurmd unit's own includes (Slurm's variable; "
             "default `/etc/slurm/slurm.conf`)", reader=AGENT),
    Variable("BCD_TOPOLOGY", "str", None,
             "where the machine sits, as `rack=r12,rail=leaf3`: the gang placer packs "
             "multi-node reservations into the fewest racks and one rail", reader=AGENT),
    Variable("BCD_SIM_VCPUS", "int", None,
             "vCPUs of a simulated machine's host (32 for `cpu`, else 96)", reader=AGENT),
    Variable("BCD_SIM_MEMORY_GIB", "int", None,
             "memory of a simulated machine's host, GiB (128 for `cpu`, else 1024)",
             reader=AGENT),
    Variable("BCD_SIM_GATEWAY", "str", None,
             "a simulated agent's session address, pinned (the fleet simulator's proxy)",
             reader=AGENT),
    Variable("BCD_SIM_CLOCK_SKEW_SECONDS", "float", 0.0,
             "moves a simulated agent's wall clock (the fleet simulator's fault)", reader=AGENT),
    Variable("BCD_SIM_FORGET_COMMANDS", "bool", False,
             "a broken simulated agent that ignores its journal (the simulator shows it "
             "catches commands run twice)", reader=AGENT),
    Variable("NOTIFY_SOCKET", "str", None, "systemd's notification socket (`Type=notify`)",
             reader=AGENT),
    Variable("WATCHDOG_USEC", "str", None, "systemd's watchdog timeout", reader=AGENT),
    Variable("WATCHDOG_PID", "str", None, "the process systemd's watchdog is meant for",
             reader=AGENT),
    environ=os.environ,
)


def forget_join_token() -> None:
    """What the agent starts never sees the join token."""
    os.environ.pop("BCD_JOIN_TOKEN", None)


@dataclass(frozen=True)
class Tuning:
    """Timing knobs, from `BCD_RENEW_MARGIN_HOURS` (renew once this little of the 24 h
    certificate is left), `BCD_RENEW_CHECK_SECONDS` (how often to look) and
    `BCD_INVENTORY_CHECK_SECONDS` (how often to read inventory and health, sent on change),
    `BCD_TELEMETRY_SECONDS` (how often GPU utilization is sent) and
    `BCD_BACKOFF_MAX_SECONDS` (the longest wait between two attempts to reach the gateway)."""

    renew_margin_hours: float = 8.0
    renew_check_seconds: float = 300.0
    inventory_check_seconds: float = 2.0
    telemetry_seconds: float = 30.0
    backoff_max_seconds: float = 30.0

    @classmethod
    def from_env(cls) -> Tuning:
        number = VARIABLES.number
        return cls(number("BCD_RENEW_MARGIN_HOURS"), number("BCD_RENEW_CHECK_SECONDS"),
                   number("BCD_INVENTORY_CHECK_SECONDS"), number("BCD_TELEMETRY_SECONDS"),
                   number("BCD_BACKOFF_MAX_SECONDS"))


@dataclass(frozen=True)
class SimFaults:
    """What the fleet simulator sets on a simulated agent (ignored on a real machine):
    `BCD_SIM_GATEWAY` pins the session's address (its own fault-injecting proxy; the
    published address is not followed), `BCD_SIM_CLOCK_SKEW_SECONDS` moves the agent's wall
    clock, and `BCD_SIM_FORGET_COMMANDS=1` stops it looking a command up in its journal (a
    broken agent, so the simulator can show that it catches commands run twice)."""

    gateway: str = ""
    clock_skew_seconds: float = 0.0
    forget_commands: bool = False

    @classmethod
    def from_env(cls, sim: bool) -> SimFaults:
        if not sim:
            return cls()
        return cls(VARIABLES.text("BCD_SIM_GATEWAY"),
                   VARIABLES.number("BCD_SIM_CLOCK_SKEW_SECONDS"),
                   VARIABLES.flag("BCD_SIM_FORGET_COMMANDS"))


@dataclass(frozen=True)
class Paths:
    root: Path

    def _at(self, relative: str) -> Path:
        return self.root / relative

    @property
    def config_dir(self) -> Path:
        return self._at("etc/bcd")

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def key_file(self) -> Path:
        return self.config_dir / "node-key.pem"

    @property
    def cert_file(self) -> Path:
        return self.config_dir / "node-cert.pem"

    @property
    def ca_file(self) -> Path:
        return self.config_dir / "serving-ca.pem"

    @property
    def socket(self) -> Path:
        return self._at("run/bcd/bcd.sock")

    @property
    def cdi_dir(self) -> Path:
        return self._at("etc/cdi")

    @property
    def state_dir(self) -> Path:
        return self._at("var/lib/bcd")


@dataclass(frozen=True)
class Config:
    server: str
    gateway: str
    node_id: str
    site_id: str
    trust_domain: str
    serving_ca_pin: str
    join_signing_pin: str
    join_encryption_pin: str
    root: str = "/"
    sim: bool = False
    sim_gpus: int = 8
    sim_variant: str = "gpu"
    hostname: str = ""
    role: str = "node"  # or "provisioner", from the join token

    @property
    def paths(self) -> Paths:
        return Paths(Path(self.root))

    def write(self, path: Path) -> None:
        lines = ["# Written by bcd join. The node's key and certificate sit beside this file.\n"]
        for name, value in asdict(self).items():
            if isinstance(value, bool):
                lines.append(f"{name} = {'true' if value else 'false'}\n")
            elif isinstance(value, int):
                lines.append(f"{name} = {value}\n")
            else:
                escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'{name} = "{escaped}"\n')
        write_private(path, "".join(lines))

    @classmethod
    def read(cls, path: Path) -> Config:
        with open(path, "rb") as handle:
            data = _toml().load(handle)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _toml() -> ModuleType:
    """TOML's parser: the standard library's, or on Python 3.10 the tomli package."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is written or replaced (inode, mtime, size); None when
    there is no file."""
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns, status.st_size


def write_private(path: Path, text: str | bytes) -> None:
    """Write a file readable by its owner alone (0600), replacing it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(text.encode() if isinstance(text, str) else text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def joined_config(paths: Paths) -> Config | None:
    """The config of a node that has joined; None before (no file, or only the server and
    pins an installer wrote)."""
    if not paths.config_file.exists():
        return None
    try:
        config = Config.read(paths.config_file)
    except TypeError:  # fields missing: written before the join
        return None
    return config if config.node_id else None
