from __future__ import annotations

from django.db import models
from django.utils import timezone

from compute.core.fields import id_field
from fleet.models.nodes import Health


class DeviceClass(models.TextChoices):
    GPU = "gpu"
    MIG = "mig"
    SHARE = "gpu-share"


class Device(models.Model):
    """A bookable atom on a node, named by its UUID: a whole GPU, a MIG instance of one, or
    a time-sliced share of one (`<gpu uuid>:share-<n>`, made when the pool's policy slices
    its GPUs). Instances and shares name their GPU as `parent`; a booking of a GPU and a
    booking of one of its parts never overlap in time (the ledger's EXCLUDE constraints).

    Devices come from inventory reports; one that disappears is kept (`present=False`) so
    its bookings keep their meaning, and is never placed again.
    """

    id = id_field("dev")
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="devices")
    uuid = models.CharField(max_length=96, unique=True)
    device_class = models.CharField(max_length=16, choices=DeviceClass.choices,
                                    default=DeviceClass.GPU)
    index = models.PositiveSmallIntegerField(default=0)
    product = models.CharField(max_length=96)
    model = models.CharField(max_length=32)
    vram_gib = models.PositiveIntegerField(default=0)
    nvlink_domain = models.CharField(max_length=32, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE,
                               related_name="parts")
    profile = models.CharField(max_length=32, blank=True,
                               help_text="A MIG instance's profile (1g.10gb), a share's "
                                         "slot (2/4).")
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.HEALTHY)
    health_reason = models.CharField(max_length=200, blank=True,
                                     help_text="Why the node reports it unhealthy (an XID, ECC "
                                               "errors, NVLink links down…).")
    present = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["node", "index", "id"]

    def __str__(self) -> str:
        return self.uuid


class GpuSample(models.Model):
    """One GPU's telemetry at one moment, as its node reported it (kept a day): what idle
    reclaim reads. Measurements, not changes of state: no audit row or event each."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(help_text="When the control plane received it.")
    utilization = models.PositiveSmallIntegerField(help_text="Percent of time busy.")
    memory_used_mib = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["device", "at"], name="fleet_sample_device_at"),
                   models.Index(fields=["at"], name="fleet_sample_at")]

    def __str__(self) -> str:
        return f"{self.device_id} {self.utilization}% at {self.at}"
