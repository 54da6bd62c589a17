from __future__ import annotations

from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class Site(models.Model):
    """Where machines live. Platform sites (shared or dedicated) belong to the root tenant."""

    class Kind(models.TextChoices):
        SHARED = "shared"
        DEDICATED = "dedicated"

    id = id_field("site")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="sites")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    region = models.CharField(max_length=63)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name or self.region} ({self.id})"
