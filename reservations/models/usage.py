"""Metering rows: what a tenant used, per meter, for each booked window that ended."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class UsageRecord(models.Model):
    """`quantity` of `meter` (e.g. `gpu.H100.hours`) used by `subject` over a window.

    One row per (subject, meter, window start): metering the same end twice writes nothing.
    """

    id = id_field("use")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="+")
    subject = models.CharField(max_length=32)
    meter = models.CharField(max_length=64)
    quantity = models.DecimalField(max_digits=18, decimal_places=6)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["subject", "meter", "window_start"],
                                               name="reservations_usage_once_per_window")]

    def __str__(self) -> str:
        return f"{self.subject} {self.quantity} {self.meter}"
