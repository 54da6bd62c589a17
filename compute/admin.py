from django.contrib import admin

from compute.models import (
    ApiToken,
    Event,
    IdempotencyRecord,
    Principal,
    RoleBinding,
    ShardLease,
    Tenant,
    WorkItem,
)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("id", "slug", "name", "parent", "created_at")
    search_fields = ("id", "slug", "name")


@admin.register(Principal)
class PrincipalAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "tenant", "kind", "disabled_at")
    list_filter = ("kind", "tenant")
    search_fields = ("id", "name")


@admin.register(RoleBinding)
class RoleBindingAdmin(admin.ModelAdmin):
    list_display = ("principal", "tenant", "role")
    list_filter = ("role", "tenant")
    search_fields = ("principal__id", "principal__name")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "principal", "expires_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("id", "name", "principal__id")
    exclude = ("secret_sha256",)
    readonly_fields = ("principal", "expires_at", "revoked_at")


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("seq", "type", "tenant", "subject", "created_at")
    list_filter = ("type", "tenant")
    search_fields = ("id", "subject", "type")

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):
    list_display = ("tenant", "scope", "key", "object_id", "created_at")
    list_filter = ("scope",)
    search_fields = ("key", "object_id")


@admin.register(WorkItem)
class WorkItemAdmin(admin.ModelAdmin):
    list_display = ("kind", "key", "shard", "due_at", "attempts", "last_error")
    list_filter = ("kind",)
    search_fields = ("key",)


@admin.register(ShardLease)
class ShardLeaseAdmin(admin.ModelAdmin):
    list_display = ("shard", "owner", "expires_at")
    search_fields = ("owner",)
