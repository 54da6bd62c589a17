"""Sandboxes: VMs that claim vCPUs and memory from the same host counters as GPU holds."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from compute.fields import id_field


class SandboxState(models.TextChoices):
    RUNNING = "running"
    RELEASED = "released"


class Sandbox(models.Model):
    id = id_field("sbx")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT,
                               related_name="sandboxes")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="sandboxes")
    node = models.ForeignKey("fleet.Node", on_delete=models.PROTECT, related_name="sandboxes")
    name = models.CharField(max_length=200, blank=True)
    vcpus = models.PositiveIntegerField()
    memory_gib = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=SandboxState.choices,
                             default=SandboxState.RUNNING)
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "sandboxes"

    def __str__(self) -> str:
        return f"{self.id} {self.vcpus} vCPU"
