"""Where bcd keeps things, its config.toml, and its tuning.

Every host path hangs off a root ("/" on a real server, a private directory for simulated
agents), so many simulated agents can run side by side without touching the real /etc.
Environment variables (all `BCD_…`) are read here, once, when the agent starts.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import ModuleType


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
        return cls(float(os.environ.get("BCD_RENEW_MARGIN_HOURS", cls.renew_margin_hours)),
                   float(os.environ.get("BCD_RENEW_CHECK_SECONDS", cls.renew_check_seconds)),
                   float(os.environ.get("BCD_INVENTORY_CHECK_SECONDS",
                                        cls.inventory_check_seconds)),
                   float(os.environ.get("BCD_TELEMETRY_SECONDS", cls.telemetry_seconds)),
                   float(os.environ.get("BCD_BACKOFF_MAX_SECONDS", cls.backoff_max_seconds)))


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
        return cls(os.environ.get("BCD_SIM_GATEWAY", ""),
                   float(os.environ.get("BCD_SIM_CLOCK_SKEW_SECONDS", "0")),
                   os.environ.get("BCD_SIM_FORGET_COMMANDS") == "1")


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
