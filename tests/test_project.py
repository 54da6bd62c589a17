"""Project-wide house rules, checked as tests."""

import subprocess
import sys
from io import StringIO

from django.core.management import call_command


def test_models_and_migrations_agree(db):
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_bcd_never_imports_django():
    code = "import bcd.__main__, bcd.contract.ids, sys; print('django' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"
