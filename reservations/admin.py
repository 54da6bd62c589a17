from django.contrib import admin
from django.db.models.expressions import RawSQL

from audit.admin import ReadOnlyAdmin, ReadOnlyInline
from compute.platform.admin import audited_action
from reservations.models import (
    Allocation,
    Booking,
    Gang,
    GroupGap,
    MaintenanceWindow,
    Offering,
    Quota,
    Reservation,
    ReservationSeries,
    Sandbox,
    StaleGaps,
    UsageDelivery,
    UsageRecord,
)
from reservations.services.release import reservation_release


class QuotaInline(ReadOnlyInline):
    model = Quota
    fields = ("resource", "limit", "used")
    readonly_fields = fields


@admin.register(Offering)
class OfferingAdmin(ReadOnlyAdmin):
    list_display = ("id", "pool", "tenant", "updated_at")
    list_filter = ("tenant",)
    search_fields = ("id", "pool__id", "tenant__slug")
    inlines = [QuotaInline]


@admin.register(Quota)
class QuotaAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "pool", "resource", "used", "limit")
    list_filter = ("resource", "tenant")
    search_fields = ("tenant__slug", "pool__id")


# Ledger rows change only through the services, which keep counters and quotas true.
LedgerReadOnly = ReadOnlyAdmin


@admin.register(Reservation)
class ReservationAdmin(LedgerReadOnly):
    list_display = ("id", "tenant", "pool", "state", "count", "during", "created_at")
    list_filter = ("state", "pool", "tenant")
    search_fields = ("id", "tenant__slug")
    actions = [audited_action(
        "reservations.release", "Release the selected reservations",
        tenant_of=lambda rsv: rsv.tenant,
        service=lambda tenant, actor, rsv: reservation_release(tenant=tenant, actor=actor,
                                                               reservation_id=rsv.pk))]


@admin.register(Gang)
class GangAdmin(LedgerReadOnly):
    list_display = ("id", "tenant", "pool", "nodes", "placements", "created_at")
    list_filter = ("pool",)
    search_fields = ("id", "tenant__slug", "pool__id")


@admin.register(ReservationSeries)
class ReservationSeriesAdmin(LedgerReadOnly):
    list_display = ("id", "tenant", "pool", "every", "time_zone", "until", "booked_through",
                    "ended_at")
    list_filter = ("ended_at",)


@admin.register(Allocation)
class AllocationAdmin(LedgerReadOnly):
    list_display = ("id", "reservation", "node", "vcpus", "memory_gib", "ended_at")
    search_fields = ("id", "reservation__id", "node__id")


@admin.register(Booking)
class BookingAdmin(LedgerReadOnly):
    list_display = ("id", "device", "allocation", "maintenance", "during")
    search_fields = ("allocation__id", "maintenance__id", "device__uuid", "device__id")


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(LedgerReadOnly):
    list_display = ("id", "node", "during", "reason", "created_by", "cancelled_at")
    search_fields = ("id", "node__id", "reason")


@admin.register(Sandbox)
class SandboxAdmin(LedgerReadOnly):
    list_display = ("id", "tenant", "pool", "node", "vcpus", "memory_gib", "state",
                    "failure_reason")
    list_filter = ("state", "pool")
    search_fields = ("id", "tenant__slug", "node__id")


@admin.register(UsageRecord)
class UsageRecordAdmin(LedgerReadOnly):
    list_display = ("subject", "tenant", "meter", "quantity", "window_start", "window_end")
    list_filter = ("meter", "tenant")
    search_fields = ("id", "subject")


class FreeTimeAdmin(ReadOnlyAdmin):
    """Derived rows whose bounds may be infinite, which Python's datetime cannot hold: the
    bounds are read and shown as text."""

    list_display = ("node_id", "domain", "starts", "ends")
    search_fields = ("node_id",)
    fields = ("node_id", "domain", "starts", "ends")
    readonly_fields = fields

    def get_queryset(self, request):  # type: ignore[no-untyped-def]
        return super().get_queryset(request).defer("lo", "hi").annotate(
            lo_text=RawSQL("lo::text", ()), hi_text=RawSQL("hi::text", ()))

    @admin.display(description="from", ordering="lo")
    def starts(self, row) -> str:  # type: ignore[no-untyped-def]
        return str(row.lo_text)

    @admin.display(description="until", ordering="hi")
    def ends(self, row) -> str:  # type: ignore[no-untyped-def]
        return str(row.hi_text)


admin.site.register([GroupGap, StaleGaps], FreeTimeAdmin)


@admin.register(UsageDelivery)
class UsageDeliveryAdmin(LedgerReadOnly):
    list_display = ("record", "sink", "delivered_at", "attempts", "next_attempt_at",
                    "last_error")
    list_filter = ("sink",)
    search_fields = ("record__id", "sink")
