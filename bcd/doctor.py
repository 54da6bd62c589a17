"""`bcd doctor`: one pass/fail line per check, non-zero exit if any fails."""

from __future__ import annotations

import os
import shutil
import stat
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bcd.cdi import vendor_spec
from bcd.config import Paths, joined_config


def _check(name: str, test: Callable[[], str]) -> bool:
    try:
        detail = test()
        print(f"pass  {name}: {detail}")
        return True
    except Exception as error:  # every failure is reported, none stops the others
        print(f"FAIL  {name}: {error}")
        return False


def run_checks(paths: Paths, *, server: str | None, sim: bool = False) -> int:
    """`sim`: a simulated machine, which has no GPUs or driver to check (and says so)."""
    config = joined_config(paths)
    sim = sim or bool(config is not None and config.sim)

    def clock() -> str:
        year = time.gmtime().tm_year
        if year < 2024:
            raise RuntimeError(f"the clock says {year}: certificates will not verify")
        return "plausible (sync it with NTP)"

    def reach() -> str:
        target = server or (config.server if config else None)
        if not target:
            return "skipped (no server given and not joined)"
        from bcd.join.client import wellknown_url

        with urllib.request.urlopen(wellknown_url(target), timeout=10):  # noqa: S310
            return f"{target} answers"

    def pins() -> str:
        if config is None:
            return "not joined yet"
        from bcd.join.client import fetch_wellknown
        from bcd.join.documents import Pins, check_wellknown

        check_wellknown(fetch_wellknown(config.server), Pins(
            config.serving_ca_pin, config.join_signing_pin, config.join_encryption_pin))
        return "the published pins match config.toml"

    def permissions() -> str:
        for path in (paths.config_file, paths.key_file):
            if path.exists() and stat.S_IMODE(path.stat().st_mode) & 0o077:
                raise RuntimeError(f"{path} is readable by others")
        return "config and key are private" if config else "nothing written yet"

    def nvidia() -> str:
        if sim:
            return "skipped: a simulated machine has simulated GPUs, no driver to check"
        binary = shutil.which("nvidia-smi")
        if binary is None:
            raise RuntimeError("nvidia-smi not found (install the NVIDIA driver)")
        return binary

    def cdi() -> str:
        directory = paths.cdi_dir
        directory.mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK):
            raise RuntimeError(f"{directory} is not writable")
        vendor = vendor_spec(paths.root)  # a malformed one raises, naming the problem
        edits = vendor.source if vendor else "no vendor spec: holds fall back to device nodes"
        return f"{directory} writable; device edits from {edits}"

    def systemd() -> str:
        if Path("/run/systemd/system").exists():
            return "present"
        return "absent: slices are named but not created"

    checks = {"time": clock, "server": reach, "pins": pins, "permissions": permissions,
              "nvidia-smi": nvidia, "cdi": cdi, "systemd": systemd}
    results = [_check(name, test) for name, test in checks.items()]
    return 0 if all(results) else 1
