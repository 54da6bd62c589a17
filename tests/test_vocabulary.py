"""Each app owns its vocabulary: its event types (`events.py`), its role grants
(`grants.py`) and the node reports it applies (`reports.py`) are collected when the apps load.
An app added beside the others (tests/support/widgets) declares a new event type, a role
grant, a report kind and an API method in its own folder, and the events filter, IAM, the
reports worker and the OpenAPI document know them, with no edit anywhere else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import json, django
django.setup()
from compute.core.api.grants import allows
from compute.platform.events.api import EventListIn
from compute.platform.events.types import REGISTERED, parse_type_globs
from compute.http.openapi import build_document
from fleet.reports import KINDS
operation = build_document()["paths"]["/api/compute/widgets/make"]["post"]
print(json.dumps({
    "owner": REGISTERED.get("widget.made"),
    "globs": parse_type_globs("widget.*,node.*"),
    "filter": EventListIn(data={"types": "widget.made"}).is_valid(),
    "member": allows("member", "widgets.make"), "viewer": allows("viewer", "widgets.make"),
    "operator": allows("operator", "widgets.make"),
    "emits": operation["x-emits"], "mutating": operation["x-mutating"],
    "report": [KINDS["widget"].apply.__module__, KINDS["widget"].refusal_action],
    "bound": KINDS["bound"].apply.__module__,
}))
"""


def test_an_app_brings_its_own_event_types_role_grants_and_methods(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False, env={"PATH": "/usr/bin:/bin", "BETTER_COMPUTE_HOME": str(tmp_path),
                          "DJANGO_SETTINGS_MODULE": "tests.support.widgets.settings"})
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"owner": "tests.support.widgets.events", "globs": ["widget.*", "node.*"],
                    "filter": True, "member": True, "viewer": False, "operator": True,
                    "emits": ["widget.made"], "mutating": True,
                    "report": ["tests.support.widgets.reports", "widget.report"],
                    "bound": "reservations.services.binding"}
    # Nothing outside the app names it: the registries found it.
    outside = [str(path.relative_to(ROOT))
               for package in ("compute", "fleet", "reservations", "audit", "gateway", "bcd")
               for path in (ROOT / package).rglob("*.py") if "widget" in path.read_text()]
    assert outside == []


def test_without_the_app_its_vocabulary_is_unknown():
    from compute.core.api.grants import allows
    from compute.platform.events.types import REGISTERED
    from fleet.reports import KINDS

    assert "widget.made" not in REGISTERED
    assert "widget" not in KINDS
    assert KINDS["bound"].apply.__module__ == "reservations.services.binding"
    assert not allows("operator", "widgets.make")
    assert REGISTERED["node.joined"] == "fleet.events"
    assert allows("member", "reservations.create")
    assert not allows("viewer", "reservations.create")


def test_one_type_has_one_owner():
    from enum import StrEnum

    import pytest

    from compute.platform.events.types import REGISTERED, event_types

    class Clash(StrEnum):
        CLASH_NEW = "clash.new"
        NODE_JOINED = "node.joined"

    with pytest.raises(ValueError, match=r"declared by fleet\.events already"):
        event_types(Clash)
    assert "clash.new" not in REGISTERED  # nothing of a refused declaration is kept
    assert REGISTERED["node.joined"] == "fleet.events"
