"""Metering: usage rows for the time a reservation or sandbox ran, closed every hour while
it runs (windows end on the hour) and at its end, each written with a delivery row per
metering sink (compute.platform.iam.metering) in the same transaction."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from compute.core.db import database_now
from compute.platform.iam.metering import sink_names
from compute.platform.queue.work import enqueue
from reservations.models import Reservation, UsageDelivery, UsageRecord
from reservations.work import USAGE_SINK

_HOUR_S = Decimal(3600)
HOUR = timedelta(hours=1)


def hours(start: datetime, end: datetime) -> Decimal:
    seconds = Decimal(max(0.0, (end - start).total_seconds()))
    return (seconds / _HOUR_S).quantize(Decimal("0.000001"))


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def usage_record(*, tenant_id: str, subject: str, meter: str, count: int, start: datetime,
                 end: datetime, rate: float = 1.0, pool_id: str | None = None,
                 priority_class: str = "", correction: bool = False) -> None:
    """`count` times the hours of [start, end) of `meter`, times `rate` (what the time
    counts for: a paused sandbox's is lower), taken back for a correction; metering a
    window twice is a no-op."""
    if end <= start or count <= 0:
        return
    quantity = (hours(start, end) * count * Decimal(str(rate))).quantize(Decimal("0.000001"))
    record, created = UsageRecord.objects.get_or_create(
        subject=subject, meter=meter, window_start=start, correction=correction,
        defaults={"tenant_id": tenant_id, "quantity": -quantity if correction else quantity,
                  "window_end": end, "pool_id": pool_id, "priority_class": priority_class})
    if created:  # its deliveries, and a worker woken to make them when this commits
        sinks = sink_names()
        due = database_now()  # the clock every attempt is timed by
        UsageDelivery.objects.bulk_create([UsageDelivery(record=record, sink=sink,
                                                         next_attempt_at=due)
                                           for sink in sinks])
        for sink in sinks:
            enqueue(USAGE_SINK, sink)


def gpu_meter(model: str, device_class: str = "gpu", profile: str = "") -> str:
    """The meter of an atom's hours: gpu.H100.hours for whole GPUs, mig.H100.1g.10gb.hours
    for MIG instances (by profile), gpu-share.H100.hours for time-sliced shares."""
    if device_class == "mig":
        return f"mig.{model}.{profile}.hours"
    return f"{device_class}.{model}.hours"


def hourly(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """[start, end) cut on the hours: no window spans two hours."""
    windows = []
    while start < end:
        stop = min(end, hour_floor(start) + HOUR)
        windows.append((start, stop))
        start = stop
    return windows


def reservation_meter(rsv: Reservation, until: datetime) -> None:
    """Meter a started reservation from where it was metered to `until` (in hour-long
    windows, so that a window never spans two hours), and remember how far it went."""
    if rsv.during is None:
        return
    start = rsv.metered_until or rsv.during.lower
    end = min(until, rsv.during.upper)
    meter = gpu_meter(rsv.pool.gpu_model, rsv.device_class, rsv.profile)
    for window_start, window_end in hourly(start, end):
        usage_record(tenant_id=rsv.tenant_id, subject=rsv.id, meter=meter, count=rsv.count,
                     start=window_start, end=window_end, pool_id=rsv.pool_id,
                     priority_class=rsv.priority_class)
    if end > (rsv.metered_until or rsv.during.lower):
        rsv.metered_until = end
        rsv.save(update_fields=["metered_until"])
