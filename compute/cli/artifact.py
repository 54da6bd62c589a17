"""The agent artifact: a wheel of bcd alone (bcd and bcd.contract; no Django, no Postgres),
under the name the installer downloads, `bcd_<version>_linux_<arch>`.

The wheel is built here, from the installed package's own files, byte for byte the same
for the same files and version (fixed timestamps), so its pinned digest is stable.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import bcd
from bcd.contract.version import version as package_version

DISTRIBUTION = "better_compute_agent"
REQUIRES = ("grpcio>=1.85.1,<2", "protobuf>=7.35.1,<8", "cryptography>=44", "PyYAML>=6,<7")
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
        "Summary: bcd, the better-compute node agent", "Requires-Python: >=3.11",
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


def write_artifacts(out: Path, *, arches: tuple[str, ...] = ("amd64", "arm64"),
                    version: str | None = None) -> dict[str, tuple[Path, str]]:
    """Write the artifact for each architecture (the agent is pure Python: one wheel);
    returns {arch: (path, sha256)}."""
    _, data = build_wheel(version)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for arch in arches:
        path = out / artifact_name(version or package_version(), arch)
        path.write_bytes(data)
        written[arch] = (path, hashlib.sha256(data).hexdigest())
    return written
