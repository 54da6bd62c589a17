from __future__ import annotations

from django.db import models
from django.utils import timezone

SHARDS = 256


class WorkItem(models.Model):
    """(kind, key) is due at `due_at`. Enqueueing an item that exists only moves it earlier
    and bumps `version`, so a pass that started before the change leaves it queued."""

    kind = models.CharField(max_length=32)
    key = models.CharField(max_length=64)
    shard = models.PositiveSmallIntegerField(db_index=True)
    due_at = models.DateTimeField(default=timezone.now)
    version = models.PositiveIntegerField(default=1)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=300, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "key"],
                                               name="compute_workitem_one_per_key")]
        indexes = [models.Index(fields=["shard", "due_at"], name="compute_workitem_due")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.key}"


class ShardLease(models.Model):
    """Who may process a shard's items, until when."""

    shard = models.PositiveSmallIntegerField(primary_key=True)
    owner = models.CharField(max_length=100, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"shard {self.shard}: {self.owner or '-'}"


class WorkerPresence(models.Model):
    """A live worker, whether or not it holds a shard yet: the fair share counts these, so a
    worker that starts after another has taken every shard still gets its share."""

    owner = models.CharField(max_length=100, primary_key=True)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.owner} until {self.expires_at}"
