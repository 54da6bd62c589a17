"""What flows between the control plane and node agents: commands down, reports up."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class CommandState(models.TextChoices):
    QUEUED = "queued"
    SENT = "sent"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"  # the agent lost its journal: whether it ran cannot be known


class NodeCommand(models.Model):
    """A one-shot command for a node, written to Postgres before any delivery. The agent's
    journal makes sure it runs at most once; `result` is the agent's signed report."""

    id = id_field("cmd")
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    signed = models.TextField(blank=True, editable=False,
                              help_text="The command signed by the control plane's "
                                        "join-signing key (bcd.contract.signed).")
    state = models.CharField(max_length=16, choices=CommandState.choices,
                             default=CommandState.QUEUED, db_index=True)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} on {self.node_id} ({self.state})"


class NodeReport(models.Model):
    """One report received from an agent, by its report id: a resent report is a no-op."""

    report_id = models.CharField(max_length=64, primary_key=True)
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="reports")
    kind = models.CharField(max_length=32)
    epoch = models.PositiveBigIntegerField(default=0, help_text="The session it came over.")
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["node", "received_at"], name="fleet_report_node_time")]

    def __str__(self) -> str:
        return self.report_id


class ReportInbox(models.Model):
    """A report as the gateway received it, not yet verified or applied.

    The gateway only files reports here: it cannot apply them (its database role has no
    grant to). A worker verifies each (the node's signature, its session epoch) and applies
    it, in the order the node sent them; refusals are audited there.
    """

    id = models.BigAutoField(primary_key=True)
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="+")
    epoch = models.PositiveBigIntegerField(help_text="The session it came over.")
    kind = models.CharField(max_length=32)
    fields = models.JSONField(default=dict, help_text="The report as the node sent it: "
                                                      "reportId, body, signature, ….")
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "filed report"  # one entry of a node's inbox
        indexes = [models.Index(fields=["node", "id"], name="fleet_inbox_node_order")]

    def __str__(self) -> str:
        return f"{self.kind} from {self.node_id}"
