from django.contrib import admin

from audit.models import AuditEvent, AuditHead, Checkpoint, SealedSecret


class ReadOnlyAdmin(admin.ModelAdmin):
    """For rows that change only through services (or never): view and search only."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    """Rows shown inside another's page, never edited there."""

    extra = 0

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """The trail is append-only."""

    list_display = ("seq", "tenant_id", "action", "target", "actor_id", "allowed", "created_at")
    list_filter = ("allowed", "action", "origin")
    search_fields = ("id", "tenant_id", "target", "actor_id", "request_id")


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant_id", "tree_size", "root_hash", "signed_at")
    search_fields = ("id", "tenant_id", "root_hash")


@admin.register(AuditHead)
class AuditHeadAdmin(ReadOnlyAdmin):
    list_display = ("tenant_id", "size")
    search_fields = ("tenant_id",)


@admin.register(SealedSecret)
class SealedSecretAdmin(ReadOnlyAdmin):
    """Names and dates only: the ciphertext is never shown."""

    list_display = ("name", "created_at")
    search_fields = ("name",)
    fields = ("name", "created_at")
