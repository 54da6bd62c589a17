"""Offerings: a pool offered to another tenant, with quotas per resource."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from compute.core.fields import id_field

GPU_RESOURCE = "gpu"
GPU_RESOURCES = (GPU_RESOURCE, "mig", "gpu-share")  # a quota per device class
HOST_RESOURCES = ("vcpu", "memory")


def granted_by_default() -> list[str]:
    return ["normal", "preemptible"]


class Offering(models.Model):
    """`pool` is offered to `tenant`. Its quotas bound what the tenant may hold at once."""

    id = id_field("off")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.CASCADE, related_name="offerings")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.CASCADE,
                               related_name="offerings")
    limits = models.JSONField(default=dict, blank=True, help_text=(
        "Against hoarding: maxDurationHours, maxStartAheadDays, maxGpusAtOnce."))
    share = models.PositiveIntegerField(default=1, help_text=(
        "The tenant's fair-share weight on the pool, against the owner's and the other "
        "offerings'."))
    priority_classes = models.JSONField(default=granted_by_default, help_text=(
        "The priority classes the tenant may ask for on the pool."))
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["pool", "tenant"],
                                               name="reservations_offering_one_per_tenant")]

    def __str__(self) -> str:
        return f"{self.pool_id} to {self.tenant_id}"


class Quota(models.Model):
    """A guarded counter: `used` never exceeds `limit` (CHECK), consumed and refunded with
    the bookings that use it, in the same transaction."""

    offering = models.ForeignKey(Offering, on_delete=models.CASCADE, related_name="quotas")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.CASCADE, related_name="+")
    resource = models.CharField(max_length=16)
    limit = models.BigIntegerField()
    used = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "pool", "resource"],
                                    name="reservations_quota_one_per_resource"),
            models.CheckConstraint(condition=Q(used__gte=0) & Q(used__lte=F("limit")),
                                   name="reservations_quota_used_within_limit"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.resource} {self.used}/{self.limit} on {self.pool_id}"
