"""Subscriptions of a URL to a tenant's events, and the log of their deliveries."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class Subscription(models.Model):
    """A URL that receives the tenant's events of `types` (globs, as `events watch`), in
    order, signed with the subscription's secret (sealed under `webhook:<id>`).

    `scanned` is the tenant's event position read up to: each later event of its types gets
    a Delivery row, in position order."""

    id = id_field("whk")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="+")
    url = models.URLField(max_length=2000)
    types = ArrayField(models.CharField(max_length=64))
    description = models.CharField(max_length=200, blank=True)
    max_attempts = models.PositiveSmallIntegerField(
        default=8, help_text="Attempts of one delivery before it is dead-lettered.")
    scanned = models.BigIntegerField(default=0)
    created_by = models.CharField(max_length=40)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.id} -> {self.url}"


class DeliveryState(models.TextChoices):
    PENDING = "pending"  # to send (again), at next_attempt_at
    DELIVERED = "delivered"  # the receiver answered 2xx
    DEAD = "dead"  # max_attempts failed: kept for replay, the next ones go on


class Delivery(models.Model):
    """One event for one subscription: what was sent, how often, and what came back. The
    event's id is the message id (`webhook-id`): the same on every attempt and replay."""

    id = id_field("wdl")
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE,
                                     related_name="deliveries")
    event = models.ForeignKey("compute.Event", on_delete=models.CASCADE, related_name="+")
    position = models.BigIntegerField(help_text="The event's position in its tenant's stream.")
    state = models.CharField(max_length=16, choices=DeliveryState.choices,
                             default=DeliveryState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["position"]
        constraints = [models.UniqueConstraint(fields=["subscription", "event"],
                                               name="webhooks_delivery_once_per_event")]
        indexes = [models.Index(fields=["subscription", "position"],
                                name="webhooks_delivery_pending",
                                condition=models.Q(state="pending"))]

    def __str__(self) -> str:
        return f"{self.subscription_id} #{self.position} {self.state}"
