"""Free time of whole GPU groups and the marks of what is stale (reservations.gaps says
how they are kept)."""

from __future__ import annotations

from django.db import models


class GroupGap(models.Model):
    pool_id = models.CharField(max_length=32)  # the node's (nodes never change pool)
    node_id = models.CharField(max_length=32)
    domain = models.CharField(max_length=32, blank=True,
                              help_text="The NVLink domain; empty for the whole node.")
    lo = models.DateTimeField(help_text="Free from (may be -infinity).")
    hi = models.DateTimeField(help_text="Free until (infinity for a node's last booking).")
    # The gap as a point (end, length) in seconds, for the GiST index that finds the gaps
    # long enough for a request and not over before its earliest start.
    end_s = models.FloatField()
    length_s = models.FloatField()

    # Indexes (migration 0014): a group's gaps touching a stretch of time (GiST), a pool's
    # gaps by shape (GiST), and a pool's groups' last gaps, to infinity.

    def __str__(self) -> str:
        return f"free time of {self.node_id}/{self.domain or '*'}"  # (bounds may be infinite)


class StaleGaps(models.Model):
    """Time a booking write changed in a group (`domain` empty for the whole node) whose gaps
    are not recomputed yet: the node's gap rows are not to be trusted until a mender has."""

    node_id = models.CharField(max_length=32, db_index=True)
    domain = models.CharField(max_length=32, blank=True)
    lo = models.DateTimeField()
    hi = models.DateTimeField()

    def __str__(self) -> str:
        return f"stale free time of {self.node_id}/{self.domain or '*'}"
