from __future__ import annotations

from django.db import models
from django.utils import timezone


class NodeSpec(models.Model):
    """The node's desired state, one row per generation: the agent converges to the newest.

    Generation 1 is written when the node is adopted; every change (a device assignment
    added or removed) writes the next generation instead of editing the last.
    """

    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="specs")
    generation = models.PositiveIntegerField()
    spec = models.JSONField(default=dict)
    signed = models.TextField(blank=True, editable=False,
                              help_text="The spec signed by the control plane's join-signing "
                                        "key (bcd.contract.signed), as relayed to the node.")
    created_at = models.DateTimeField(default=timezone.now)
    txid = models.BigIntegerField(null=True, editable=False,
                                  help_text="The writing transaction's id (see compute.core.db).")

    class Meta:
        ordering = ["node", "generation"]
        constraints = [models.UniqueConstraint(fields=["node", "generation"],
                                               name="fleet_nodespec_one_per_generation")]
        indexes = [models.Index(fields=["txid", "id"], name="fleet_nodespec_commit_order")]

    def __str__(self) -> str:
        return f"{self.node_id} gen {self.generation}"
