"""Webhooks' series read when `/metrics` is scraped: deliveries by state per tenant (the
workers count attempts themselves: `bc_webhook_attempts_total{outcome}`)."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from compute.platform.webhooks.models import Delivery


def webhook_series() -> Iterator[GaugeMetricFamily]:
    family = GaugeMetricFamily(
        "bc_webhook_deliveries", "Webhook deliveries in the log, by tenant and state "
        "(pending: waiting to be sent or sent again; dead: past their attempts).",
        labels=["tenant", "state"])
    rows = (Delivery.objects.values_list("subscription__tenant__slug", "state")
            .annotate(n=Count("pk")).order_by())
    for tenant, state, n in sorted(rows):
        family.add_metric([tenant, state], n)
    yield family
