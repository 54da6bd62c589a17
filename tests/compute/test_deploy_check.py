"""`manage.py check --deploy`: every warning is one a production setting from the
environment silences."""

from __future__ import annotations

import os
import subprocess
import sys

PRODUCTION = {"BETTER_COMPUTE_TLS": "1", "BETTER_COMPUTE_HSTS_SUBDOMAINS": "1",
              "BETTER_COMPUTE_HSTS_PRELOAD": "1",
              "BETTER_COMPUTE_SECRET_KEY": "k" * 64 + "-production-secret-from-a-file"}


def deploy_check(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                           "--fail-level", "WARNING"], env={**env, **extra},
                          capture_output=True, text=True, timeout=120, check=False)


def test_production_settings_from_the_environment_pass_the_deploy_check():
    checked = deploy_check(PRODUCTION)
    assert checked.returncode == 0, checked.stderr
    assert "no issues" in checked.stdout


def test_without_tls_the_deploy_check_names_what_tls_would_set():
    checked = deploy_check({})
    assert checked.returncode != 0
    warned = {line.split(")")[0].split("(")[-1] for line in checked.stderr.splitlines()
              if line.startswith("?: (")}
    assert warned == {"security.W004", "security.W008", "security.W012", "security.W016"}
