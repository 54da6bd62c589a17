"""Every module of the control plane and of bcd sits in an import-linter layer, and the CLI
and bcd load no Django."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTROL_PLANE = ("compute", "fleet", "reservations", "audit", "gateway")


def contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def layered(name: str, *, container: str = "") -> set[str]:
    """The module prefixes named by the layers contract called `name`."""
    contract = next(c for c in contracts() if c["name"] == name)
    prefix = f"{container}." if container else ""
    return {prefix + part.strip() for layer in contract["layers"] for part in layer.split(":")}


def modules(package: str) -> list[str]:
    found = [package]
    for info in pkgutil.walk_packages([str(ROOT / package.replace(".", "/"))], f"{package}."):
        found.append(info.name)
    return found


def outside(names: list[str], prefixes: set[str], roots: set[str]) -> list[str]:
    return [name for name in names if name not in roots
            and not any(name == p or name.startswith(p + ".") for p in prefixes)]


def test_every_control_plane_module_is_in_a_layer():
    prefixes = layered("imports point down")
    names = [m for package in CONTROL_PLANE for m in modules(package)]
    assert len(names) > 100
    assert outside(names, prefixes, roots=set(CONTROL_PLANE)) == []


def test_every_bcd_module_is_in_a_layer():
    prefixes = layered("bcd's own layers", container="bcd")
    assert outside(modules("bcd"), prefixes, roots={"bcd"}) == []


def test_no_contract_waives_an_import():
    assert [c["name"] for c in contracts() if c.get("ignore_imports")] == []


@pytest.mark.parametrize("entry", ["compute.cli.main", "compute.client", "bcd.__main__",
                                   "bcd.agent"])
def test_the_cli_and_bcd_load_no_django(entry):
    probe = (f"import sys, {entry}; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('django', 'rest_framework', 'channels', 'django_q', 'daphne')))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]"


def test_the_layers_name_packages_never_modules():
    named = layered("imports point down")
    modules_named = [name for name in named
                     if not (ROOT / name.replace(".", "/") / "__init__.py").exists()]
    assert modules_named == []
    # compute's top level holds its three layers' packages and nothing else
    top = sorted(p.name for p in (ROOT / "compute").iterdir()
                 if p.suffix == ".py" or (p / "__init__.py").exists())
    assert top == ["__init__.py", "cli", "client", "core", "http", "platform", "project"]
