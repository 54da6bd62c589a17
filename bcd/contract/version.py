"""The one version every program prints (`better-compute`, `bcd`, the gateway)."""

from __future__ import annotations


def version() -> str:
    from importlib import metadata  # on call: it costs every command ~20 ms to load

    for distribution in ("better-compute", "better-compute-agent"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "0+unknown"
