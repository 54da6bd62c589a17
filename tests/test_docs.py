"""The documentation is generated where it can be and checked where it cannot: the reference
pages say what the code says, every command, method, event and variable has its entry, the
README stays one page, and nothing reads the environment outside the declared settings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import reference

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("compute", "fleet", "reservations", "audit", "gateway", "bcd")
# Names that are not read from the environment: what bcd writes into a hold's env file for the
# workload, and the install script's own shell variable.
NOT_READ = {"BCD_GPU", "BCD_GPU_SHARES", "BCD_RESERVATION_ID", "BCD_ALLOCATION_ID",
            "BCD_CGROUP_PARENT", "BCD_CDI_DEVICES", "BCD_VERSION", "BCD_PREEMPT_NOTICE",
            "BCD_ENDS_AT", "BCD_ENDING_NOTICE"}


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return reference.pages()


def page(name: str) -> str:
    return (reference.PAGES / name).read_text()


def test_the_reference_pages_are_what_the_code_generates(pages):
    stale = [name for name, text in pages.items()
             if not (reference.PAGES / name).exists() or page(name) != text]
    assert not stale, f"run `python -m scripts.reference`: {stale} differ from the code"


def test_every_cli_command_has_an_entry():
    cli = page("cli.md")
    names = [name for name, _ in reference.cli_commands()]
    assert len(names) > 50
    assert [n for n in names if f"## `{n}`\n" not in cli] == []


@pytest.mark.django_db
def test_every_api_method_has_an_entry():
    from compute.core.api.registry import REGISTRY

    api = page("api.md")
    methods = [f"{group}.{method}" for group, method in REGISTRY]
    assert len(methods) > 50
    assert [m for m in methods if f"## `{m}`\n" not in api] == []


def test_every_event_type_has_an_entry():
    events = page("events.md")
    assert [t for t in reference.event_types() if f"| `{t}` |" not in events] == []


def test_every_environment_variable_has_an_entry():
    settings = page("settings.md")
    declared = {v.name for v in reference.variables()}
    assert [v for v in declared if f"| `{v}` |" not in settings] == []
    # and every variable the product names is declared (or is not read at all)
    named = set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            named |= set(re.findall(r"[\"'\s=]((?:BETTER_COMPUTE|BCD)_[A-Z0-9_]+)\b",
                                    path.read_text()))
    named = {n for n in named if not n.endswith("_")}
    assert sorted(named - declared - NOT_READ) == []


def test_nothing_reads_the_environment_outside_the_declared_settings():
    allowed = {ROOT / "compute" / "core" / "config.py", ROOT / "bcd" / "config.py"}
    readers = [str(path.relative_to(ROOT)) for package in PRODUCT
               for path in (ROOT / package).rglob("*.py")
               if path not in allowed and re.search(r"os\.environ|os\.getenv|getenv\(",
                                                    path.read_text())]
    assert readers == []


def test_a_value_that_does_not_parse_names_its_variable():
    result = subprocess.run(
        [sys.executable, "-c", "import compute.project.settings"], cwd=ROOT, capture_output=True,
        text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "BETTER_COMPUTE_HEARTBEAT_SECONDS": "ten",
             "DATABASE_URL": "postgresql://nobody@/none?host=/nowhere"})
    assert result.returncode == 1
    assert "BETTER_COMPUTE_HEARTBEAT_SECONDS='ten' is not a whole number" in result.stderr


def test_importing_the_settings_writes_nothing(tmp_path):
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, "-c", "import compute.project.settings as s; print(s.STATIC_ROOT)"],
        cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "BETTER_COMPUTE_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(home / "static")
    assert not home.exists()


def test_the_readme_is_one_page_that_points_at_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "pip install -e . && better-compute dev --memory --sim 8" in readme
    assert "pip install -e '.[test]' && python -m pytest" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_every_test_the_tutorial_names_exists():
    tutorial = (ROOT / "docs" / "tutorial.md").read_text()
    named = re.findall(r"`(?:tests/)?((?:[a-z0-9_]+/)*test_[a-z_]+\.py|[a-z_]+/)`", tutorial)
    assert len(named) >= 10
    for path in named:
        assert (ROOT / "tests" / path).exists(), path
