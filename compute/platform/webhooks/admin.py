"""Webhooks in the admin: read-only (subscribe, replay and delete through the API)."""

from django.contrib import admin

from audit.admin import ReadOnlyAdmin
from compute.platform.webhooks.models import Delivery, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "url", "types", "max_attempts", "scanned", "created_at")
    search_fields = ("id", "url", "tenant__slug")


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "subscription", "position", "state", "attempts", "last_status",
                    "next_attempt_at")
    list_filter = ("state",)
    search_fields = ("id", "subscription__id")
