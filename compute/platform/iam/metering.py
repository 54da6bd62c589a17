"""Where closed usage goes: metering sinks.

The IAM backend is one (`record_usage`, the seed's "gpu.<model>.hours to Better IAM": the
embedded IAM keeps each record in `IamUsage`), and every URL of BETTER_COMPUTE_USAGE_SINK_URLS
is another, which receives each record as a CloudEvent (`com.better-compute.usage`, the
record's id as the event's id). Records reach each sink through an outbox
(reservations.services.usage_sinks): at least once, retried with backoff, and a sink keeps
each id once, so it holds every record exactly once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Protocol

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder

from compute.platform.iam import authorizer
from compute.platform.iam.usage import IamUsage

IAM_SINK = "iam"


@dataclass(frozen=True)
class MeterRecord:
    id: str
    tenant_id: str
    tenant: str  # its slug
    pool_id: str
    subject: str
    meter: str
    quantity: str  # a decimal, as text
    window_start: datetime
    window_end: datetime
    priority_class: str
    correction: bool = False  # a negative quantity: time metered past a late-reported end


class SinkFailed(RuntimeError):
    """The sink did not take the record; it is tried again later."""


class UsageRecorder(Protocol):
    """What an IAM backend implements to receive usage (idempotent by record id)."""

    def record_usage(self, record: MeterRecord) -> None: ...


class EmbeddedUsage:
    """The embedded IAM's side: each record kept once, by id."""

    def record_usage(self, record: MeterRecord) -> None:
        IamUsage.objects.get_or_create(record_id=record.id, defaults={
            "tenant_id": record.tenant_id, "meter": record.meter,
            "quantity": record.quantity, "window_start": record.window_start,
            "window_end": record.window_end})


def sink_names() -> list[str]:
    """The IAM backend, then each configured URL (the name a delivery row carries)."""
    urls = [u.strip() for u in settings.BC_USAGE_SINK_URLS.split(",") if u.strip()]
    return [IAM_SINK, *urls]


def deliver(sink: str, record: MeterRecord) -> None:
    """Hand `record` to `sink`; SinkFailed when it did not take it."""
    if sink == IAM_SINK:
        backend = authorizer()
        recorder = backend if hasattr(backend, "record_usage") else EmbeddedUsage()
        recorder.record_usage(record)
        return
    _post_cloud_event(sink, record)


def cloud_event(record: MeterRecord) -> dict[str, object]:
    """The record as a CloudEvent 1.0 in structured mode."""
    return {"specversion": "1.0", "type": "com.better-compute.usage",
            "source": "/better-compute/usage", "id": record.id, "subject": record.subject,
            "time": record.window_end, "datacontenttype": "application/json",
            "data": {k: v for k, v in asdict(record).items() if k != "id"}}


def _post_cloud_event(url: str, record: MeterRecord) -> None:
    from compute.platform.webhooks.outbound import post

    body = json.dumps(cloud_event(record), cls=DjangoJSONEncoder).encode()
    outcome = post(url, body, {"content-type": "application/cloudevents+json",
                               "idempotency-key": record.id})
    if not outcome.ok:
        raise SinkFailed(outcome.error)
