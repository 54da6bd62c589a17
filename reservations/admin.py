from django.contrib import admin

from reservations.models import Offering, Quota


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 0
    readonly_fields = ("used",)


@admin.register(Offering)
class OfferingAdmin(admin.ModelAdmin):
    list_display = ("id", "pool", "tenant", "updated_at")
    list_filter = ("tenant",)
    search_fields = ("id", "pool__id", "tenant__slug")
    inlines = [QuotaInline]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ("tenant", "pool", "resource", "used", "limit")
    list_filter = ("resource", "tenant")
    search_fields = ("tenant__slug", "pool__id")
