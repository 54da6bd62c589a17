from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class PoolClass(models.TextChoices):
    METAL_HOST = "metal-host", "bare-metal hosts whose GPUs are reserved as holds"
    CPU_HOST = "cpu-host", "hosts whose vCPUs and memory run sandboxes"


class Pool(models.Model):
    """A set of machines of one GPU model (or CPU only) under one policy.

    The policy (validated on write, stored in wire form) names the acceptance checks a
    joining machine must pass, what it must show (`expect.gpuCount`), the host CPUs and
    memory a booking takes per GPU (`hostShare`) and whether Kubernetes workers may use it.
    """

    id = id_field("pool")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="pools")
    site = models.ForeignKey("fleet.Site", on_delete=models.PROTECT, related_name="pools")
    name = models.CharField(max_length=200, blank=True)
    pool_class = models.CharField(max_length=16, choices=PoolClass.choices)
    gpu_model = models.CharField(max_length=63, blank=True)
    policy = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name or self.gpu_model or self.pool_class} ({self.id})"

    @property
    def host_share(self) -> dict[str, Any]:
        return dict(self.policy.get("hostShare") or {})

    @property
    def shares_per_gpu(self) -> int:
        """Time-sliced shares of each GPU (policy.timeSlicing.replicas); 0 when not sliced."""
        return int((self.policy.get("timeSlicing") or {}).get("replicas") or 0)
