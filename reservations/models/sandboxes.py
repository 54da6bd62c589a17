"""Sandboxes: VMs that claim vCPUs and memory from the same host counters as GPU holds."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class SandboxState(models.TextChoices):
    """placed: counters claimed, the VM is in the node's spec; starting: QEMU runs on the
    node; running: the guest said it booted (only the node's signed report sets it);
    paused: the node said it stopped the guest's CPUs (its memory stays claimed);
    stopping: released, the node is stopping it; stopped; failed (with a reason)."""

    PLACED = "placed"
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


LIVE = (SandboxState.PLACED, SandboxState.STARTING, SandboxState.RUNNING, SandboxState.PAUSED)


class Sandbox(models.Model):
    id = id_field("sbx")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT,
                               related_name="sandboxes")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="sandboxes")
    node = models.ForeignKey("fleet.Node", on_delete=models.PROTECT, related_name="sandboxes")
    image = models.ForeignKey("fleet.Image", on_delete=models.SET_NULL, null=True,
                              related_name="sandboxes")
    name = models.CharField(max_length=200, blank=True)
    vcpus = models.PositiveIntegerField()
    memory_gib = models.PositiveIntegerField()
    forwards = models.JSONField(default=list, blank=True)  # [{hostPort, guestPort}]
    network = models.CharField(max_length=16, default="none")  # none | outbound
    desired = models.CharField(max_length=16, default="running")  # running | paused
    state = models.CharField(max_length=16, choices=SandboxState.choices,
                             default=SandboxState.PLACED)
    failure_reason = models.CharField(max_length=300, blank=True)
    exit_status = models.IntegerField(null=True, blank=True)
    accelerator = models.CharField(max_length=8, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)  # the node said it booted
    metered_from = models.DateTimeField(null=True, blank=True)  # its unmetered time since
    expires_at = models.DateTimeField(null=True, blank=True)  # released then (--timeout)
    released_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)  # stopped or failed: counters freed

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "sandboxes"
        indexes = [models.Index(fields=["expires_at"], condition=models.Q(
            ended_at__isnull=True, released_at__isnull=True, expires_at__isnull=False),
            name="sandbox_expiring")]

    def __str__(self) -> str:
        return f"{self.id} {self.vcpus} vCPU"
