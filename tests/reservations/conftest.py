from __future__ import annotations

from tests.conftest import POLICY

__all__ = ["HOUR", "POLICY", "gpus", "reserve"]
HOUR = 3_600_000


def gpus(count, topology="any"):
    return [{"class": "gpu", "count": count, "topology": topology}]


def reserve(client, pool, count, topology="any", duration=HOUR, **extra):
    return client.call("reservations.create", poolId=pool["id"], devices=gpus(count, topology),
                       duration=duration, **extra)
