"""Sandbox images: a pool's catalogue of bootable parts, each named by URL and sha256."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class Image(models.Model):
    """A kernel, an initrd and optionally a raw disk, which nodes fetch by URL and accept
    only when the bytes match the sha256 given here. `ready_line` is what the guest prints
    on its serial console once it has booted."""

    id = id_field("img")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="images")
    name = models.CharField(max_length=63)
    kernel_url = models.CharField(max_length=2000)
    kernel_sha256 = models.CharField(max_length=64)
    initrd_url = models.CharField(max_length=2000)
    initrd_sha256 = models.CharField(max_length=64)
    disk_url = models.CharField(max_length=2000, blank=True)
    disk_sha256 = models.CharField(max_length=64, blank=True)
    ready_line = models.CharField(max_length=200, default="better-compute guest ready")
    # Sandboxes start from a snapshot of a booted guest of this image (made once per node
    # and shape) instead of booting; the image must run QEMU's guest agent.
    snapshot = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pool", "name"]
        constraints = [models.UniqueConstraint(fields=["pool", "name"],
                                               name="fleet_image_name_per_pool")]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    def parts(self) -> dict[str, dict[str, str]]:
        """The parts in the spec's wire form."""
        parts = {"kernel": {"url": self.kernel_url, "sha256": self.kernel_sha256},
                 "initrd": {"url": self.initrd_url, "sha256": self.initrd_sha256}}
        if self.disk_url:
            parts["disk"] = {"url": self.disk_url, "sha256": self.disk_sha256}
        return parts
