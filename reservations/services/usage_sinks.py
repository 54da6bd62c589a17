"""Delivering closed usage to the metering sinks (compute.platform.iam.metering): each
record's delivery row, written with it, is sent until the sink takes it, each retried after
1, 2, 4 … s (at most an hour) without holding up the others."""

from __future__ import annotations

from audit.services import audit_exempt, audited
from compute.core.db import database_now
from compute.platform.iam.metering import MeterRecord, SinkFailed, deliver
from compute.platform.queue.work import enqueue
from compute.platform.webhooks.outbound import retry_wait
from reservations.models import UsageDelivery, UsageRecord
from reservations.work import USAGE_SINK

BATCH = 200


def meter_record(record: UsageRecord) -> MeterRecord:
    return MeterRecord(id=record.id, tenant_id=record.tenant_id, tenant=record.tenant.slug,
                       pool_id=record.pool_id or "", subject=record.subject,
                       meter=record.meter, quantity=str(record.quantity),
                       window_start=record.window_start, window_end=record.window_end,
                       priority_class=record.priority_class, correction=record.correction)


@audited
def usage_delivery_record(delivery_id: int, error: str | None) -> None:
    """One attempt's outcome: delivered, or to be tried again after a backoff."""
    delivery = (UsageDelivery.objects.select_for_update()
                .filter(pk=delivery_id, delivered_at__isnull=True).first())
    if delivery is not None:
        now = database_now()
        delivery.attempts += 1
        if error is None:
            delivery.delivered_at, delivery.last_error = now, ""
        else:
            delivery.next_attempt_at = now + retry_wait(delivery.attempts)
            delivery.last_error = error[:300]
        delivery.save(update_fields=["attempts", "delivered_at", "next_attempt_at",
                                     "last_error"])
    audit_exempt("a usage record handed to a metering sink, recorded in its delivery row")


def usage_sink_pass(sink: str) -> None:
    """Send what is due to `sink`, then queue the next pass for when more is due."""
    due = list(UsageDelivery.objects.select_related("record__tenant")
               .filter(sink=sink, delivered_at__isnull=True,
                       next_attempt_at__lte=database_now()).order_by("id")[:BATCH])
    for delivery in due:
        try:
            deliver(sink, meter_record(delivery.record))
        except SinkFailed as failed:
            usage_delivery_record(delivery.id, str(failed))
        else:
            usage_delivery_record(delivery.id, None)
    later = (UsageDelivery.objects.filter(sink=sink, delivered_at__isnull=True)
             .order_by("next_attempt_at").values_list("next_attempt_at", flat=True).first())
    if later is not None:
        enqueue(USAGE_SINK, sink, due_at=later)
