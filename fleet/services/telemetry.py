"""GPU telemetry from nodes: utilization samples per GPU, kept a day."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

from django.db import transaction

from compute.core.db import database_now
from compute.core.errors import InvalidArgument
from fleet.models import Device, DeviceClass, GpuSample, Node
from fleet.services.sessions import StaleSession, report_claim
from fleet.work import node_telemetry_recorded

KEPT = timedelta(days=1)


def parse_telemetry(body: str) -> dict[str, tuple[int, int]]:
    """GPU UUID -> (utilization %, memory used MiB), naming the first bad field."""
    data: Any = json.loads(body or "{}")
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict):
        raise InvalidArgument("telemetry: gpus must map GPU UUIDs to readings", field="gpus")
    readings = {}
    for uuid, reading in gpus.items():
        where = f"gpus.{uuid}"
        if not isinstance(reading, dict):
            raise InvalidArgument(f"{where} must be an object", field=where)
        utilization: Any = reading.get("utilization")
        memory: Any = reading.get("memoryUsedMiB", 0)
        if not _number(utilization) or not 0 <= utilization <= 100:
            raise InvalidArgument(f"{where}.utilization must be a percentage",
                                  field=f"{where}.utilization")
        if not _number(memory) or memory < 0:
            raise InvalidArgument(f"{where}.memoryUsedMiB must be a non-negative number",
                                  field=f"{where}.memoryUsedMiB")
        readings[str(uuid)[:96]] = (round(utilization), round(min(memory, 2**31 - 1)))
    return readings


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@transaction.atomic
def telemetry_record(*, node_id: str, epoch: int, report_id: str, body: str) -> int:
    """Store a node's readings of its own present GPUs (others are ignored) at the database's
    now, and queue the idle check of its holds; returns how many samples were stored (0
    for a report received before: a replayed reading is not a new one)."""
    readings = parse_telemetry(body)
    # Without the node row's lock, which bookers of the node take: samples change nothing.
    if not Node.objects.filter(pk=node_id, session_epoch=epoch).exists():
        raise StaleSession(node_id)
    if not report_claim(report_id=report_id, node_id=node_id, kind="telemetry", epoch=epoch):
        return 0
    now = database_now()
    devices = Device.objects.filter(node_id=node_id, present=True, device_class=DeviceClass.GPU,
                                    uuid__in=list(readings)).values_list("id", "uuid")
    samples = [GpuSample(device_id=device_id, at=now, utilization=readings[uuid][0],
                         memory_used_mib=readings[uuid][1]) for device_id, uuid in devices]
    GpuSample.objects.bulk_create(samples)
    if samples:
        node_telemetry_recorded(node_id)
    return len(samples)


def samples_prune() -> int:
    """Drop samples older than a day; returns how many."""
    deleted, _ = GpuSample.objects.filter(at__lt=database_now() - KEPT).delete()
    return deleted
