"""The transactional outbox: one row per state change, written with the change."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class Event(models.Model):
    """A state change. `seq` is the order rows were written in; `position` numbers a
    tenant's events 1, 2, 3… once they have committed (compute.platform.events.sequencer), and is
    what the API calls an event's `seq`: readers page by it, so a reader's cursor never
    passes an event that commits later.

    The payload carries ids and small facts only, since consumers may replay rows.
    """

    seq = models.BigAutoField(primary_key=True)
    id = id_field("evt", primary_key=False)
    type = models.CharField(max_length=64, db_index=True)
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="+")
    subject = models.CharField(max_length=32, db_index=True)
    payload = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now)
    position = models.BigIntegerField(null=True, editable=False)

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["tenant", "seq"], name="compute_event_unnumbered",
                                condition=models.Q(position__isnull=True))]
        constraints = [models.UniqueConstraint(fields=["tenant", "position"],
                                               name="compute_event_one_per_position")]

    def __str__(self) -> str:
        return f"{self.seq} {self.type} {self.subject}"

class EventHead(models.Model):
    """How many events of a tenant have positions; the sequencer holds its row."""

    tenant_id = models.CharField(max_length=32, primary_key=True)
    size = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.size}"
