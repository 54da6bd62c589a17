"""What the fleet publishes in /.well-known/better-compute: the PKI's public halves and pins."""

from __future__ import annotations

from typing import Any

from fleet.pki import pki


def contribute() -> dict[str, Any]:
    return pki().published()
