from __future__ import annotations

from django.db import models
from django.utils import timezone


class SpentSeal(models.Model):
    """The SHA-256 of every sealed join token that was accepted: a replay is refused."""

    digest = models.CharField(max_length=64, primary_key=True)
    token = models.ForeignKey("fleet.JoinToken", on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.digest
