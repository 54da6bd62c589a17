"""The transactional outbox: one row per state change, written with the change."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from compute.fields import id_field


class Event(models.Model):
    """A state change. `seq` is the global order that `events.list` and watchers page by.

    The payload carries ids and small facts only, since consumers may replay rows.
    """

    seq = models.BigAutoField(primary_key=True)
    id = id_field("evt", primary_key=False)
    type = models.CharField(max_length=64, db_index=True)
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="+")
    subject = models.CharField(max_length=32, db_index=True)
    payload = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now)
    txid = models.BigIntegerField(null=True, editable=False,
                                  help_text="The writing transaction's id (see selectors).")

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["tenant", "seq"], name="compute_event_tenant_seq")]

    def __str__(self) -> str:
        return f"{self.seq} {self.type} {self.subject}"

