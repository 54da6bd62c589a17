"""Metering: usage rows written when a booked window ends (in the ending transaction)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from reservations.models import UsageRecord

_HOUR_S = Decimal(3600)


def hours(start: datetime, end: datetime) -> Decimal:
    seconds = Decimal(max(0.0, (end - start).total_seconds()))
    return (seconds / _HOUR_S).quantize(Decimal("0.000001"))


def usage_record(*, tenant_id: str, subject: str, meter: str, count: int, start: datetime,
                 end: datetime, rate: float = 1.0) -> None:
    """`count` times the hours of [start, end) of `meter`, times `rate` (what the time
    counts for: a paused sandbox's is lower); metering a window twice is a no-op."""
    if end <= start or count <= 0:
        return
    quantity = (hours(start, end) * count * Decimal(str(rate))).quantize(Decimal("0.000001"))
    UsageRecord.objects.get_or_create(
        subject=subject, meter=meter, window_start=start,
        defaults={"tenant_id": tenant_id, "quantity": quantity,
                  "window_end": end})


def gpu_meter(model: str, device_class: str = "gpu", profile: str = "") -> str:
    """The meter of an atom's hours: gpu.H100.hours for whole GPUs, mig.H100.1g.10gb.hours
    for MIG instances (by profile), gpu-share.H100.hours for time-sliced shares."""
    if device_class == "mig":
        return f"mig.{model}.{profile}.hours"
    return f"{device_class}.{model}.hours"
