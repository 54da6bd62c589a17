from django.contrib import admin

from audit.admin import ReadOnlyAdmin
from fleet.models import (
    Device,
    JoinToken,
    Node,
    NodeCommand,
    NodeReport,
    NodeSpec,
    Pool,
    Site,
    SpentSeal,
)


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "kind", "region", "tenant", "created_at")
    list_filter = ("kind", "region")
    search_fields = ("id", "name", "region")


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "pool_class", "gpu_model", "site", "tenant")
    list_filter = ("pool_class", "gpu_model", "site")
    search_fields = ("id", "name", "gpu_model")


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0
    fields = ("uuid", "index", "product", "nvlink_domain", "health", "present")
    readonly_fields = fields


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("id", "hostname", "pool", "provision_state", "connectivity", "health",
                    "cordoned", "vcpus_allocated", "vcpus")
    list_filter = ("provision_state", "connectivity", "health", "cordoned", "pool")
    search_fields = ("id", "hostname", "serial", "product_uuid")
    readonly_fields = ("vcpus_allocated", "memory_gib_allocated")
    inlines = [DeviceInline]


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ("id", "uuid", "node", "index", "product", "nvlink_domain", "health",
                    "present")
    list_filter = ("model", "health", "present", "device_class")
    search_fields = ("id", "uuid", "node__id", "node__hostname")


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    list_display = ("id", "pool", "uses", "max_uses", "expires_at", "revoked_at")
    list_filter = ("pool",)
    search_fields = ("id", "expect_serial", "expect_product_uuid", "expect_mac")
    exclude = ("secret_sha256",)
    readonly_fields = ("uses", "nodes")


@admin.register(NodeCommand)
class NodeCommandAdmin(ReadOnlyAdmin):
    list_display = ("id", "node", "kind", "state", "created_at", "finished_at")
    list_filter = ("state", "kind")
    search_fields = ("id", "node__id")


@admin.register(NodeReport)
class NodeReportAdmin(ReadOnlyAdmin):
    list_display = ("report_id", "node", "kind", "received_at")
    list_filter = ("kind",)
    search_fields = ("report_id", "node__id")


@admin.register(NodeSpec)
class NodeSpecAdmin(ReadOnlyAdmin):
    list_display = ("node", "generation", "created_at")
    search_fields = ("node__id",)


@admin.register(SpentSeal)
class SpentSealAdmin(ReadOnlyAdmin):
    list_display = ("digest", "token", "created_at")
    search_fields = ("digest", "token__id")
