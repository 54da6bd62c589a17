from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from compute.core.fields import id_field


class JoinToken(models.Model):
    """Lets `max_uses` machines join `pool` until `expires_at`: `bcjt_<id>.<secret>`.

    Only the SHA-256 of the secret is kept. An `expect_*` value binds the token to one
    machine's serial, product UUID or MAC address.
    """

    id = id_field("jtk")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.CASCADE, related_name="join_tokens")
    secret_sha256 = models.CharField(max_length=64)
    role = models.CharField(max_length=16, default="node")
    max_uses = models.PositiveIntegerField(default=1)
    uses = models.PositiveIntegerField(default=0)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    expect_serial = models.CharField(max_length=128, blank=True)
    expect_product_uuid = models.CharField(max_length=64, blank=True)
    expect_mac = models.CharField(max_length=17, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    adopts = models.ForeignKey(
        "fleet.Node", on_delete=models.CASCADE, null=True, blank=True, related_name="+",
        help_text="The enrolled machine a deploy minted this token for: the agent of the OS "
                  "it writes joins as that node.")
    nodes = ArrayField(models.CharField(max_length=32), default=list, blank=True,
                       help_text="Nodes that joined with this token.")

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.CheckConstraint(condition=Q(uses__lte=F("max_uses")),
                                              name="fleet_jointoken_uses_within_max")]

    def __str__(self) -> str:
        return self.id

    @property
    def bound(self) -> bool:
        return bool(self.expect_serial or self.expect_product_uuid or self.expect_mac)
