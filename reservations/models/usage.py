"""Metering rows: what a tenant used, per meter, in windows closed hourly and at the end; and
their delivery to each metering sink (an outbox written with the record)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class UsageRecord(models.Model):
    """`quantity` of `meter` (e.g. `gpu.H100.hours`) used by `subject` over a window, in
    `pool` at `priority_class`. A running reservation or sandbox is closed every hour
    (windows end on the hour) and at its end.

    One row per (subject, meter, window start, correction): metering the same window twice
    writes nothing. A correction takes back time metered past an end the node reported late
    (closed hours it had not run)."""

    id = id_field("use")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="+")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="+",
                             null=True)
    subject = models.CharField(max_length=32)
    meter = models.CharField(max_length=64)
    priority_class = models.CharField(max_length=32, blank=True, default="", db_default="")
    quantity = models.DecimalField(max_digits=18, decimal_places=6)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    correction = models.BooleanField(default=False, db_default=False, help_text=(
        "Takes back (a negative quantity) time metered past an end that was reported late."))
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(
            fields=["subject", "meter", "window_start", "correction"],
            name="reservations_usage_once_per_window")]
        indexes = [models.Index(fields=["window_start"], name="reservations_usage_start")]

    def __str__(self) -> str:
        return f"{self.subject} {self.quantity} {self.meter}"


class UsageDelivery(models.Model):
    """One record for one metering sink (compute.platform.iam.metering): pending until the
    sink took it, retried with backoff."""

    record = models.ForeignKey(UsageRecord, on_delete=models.CASCADE, related_name="deliveries")
    sink = models.CharField(max_length=300)
    delivered_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.CharField(max_length=300, blank=True)

    class Meta:
        verbose_name_plural = "usage deliveries"
        constraints = [models.UniqueConstraint(fields=["record", "sink"],
                                               name="reservations_usage_delivery_once")]
        indexes = [models.Index(fields=["sink", "next_attempt_at"],
                                name="reservations_usage_pending",
                                condition=models.Q(delivered_at__isnull=True))]

    def __str__(self) -> str:
        return f"{self.record_id} -> {self.sink}"
