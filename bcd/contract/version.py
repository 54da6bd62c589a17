"""The one version every program prints (`better-compute`, `bcd`, the gateway)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    for distribution in ("better-compute", "better-compute-agent"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "0+unknown"
