"""Usage the embedded IAM received from the ledger (compute.platform.iam.metering)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class IamUsage(models.Model):
    """One closed usage record, kept once by its id."""

    record_id = models.CharField(max_length=32, unique=True)
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="+")
    meter = models.CharField(max_length=64)
    quantity = models.DecimalField(max_digits=18, decimal_places=6)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.record_id} {self.quantity} {self.meter}"
