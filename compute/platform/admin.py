"""The Django admin: read-only for every row whose writes must be audited.

Nothing here saves a model. State changes are admin actions (`audited_action`) that call
the same service as the API method, after the same IAM decision for the signed-in user's
principal, so each writes its audit row and outbox event like a call from the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django_q.admin  # noqa: F401  (registered first, so made read-only below)
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from audit.admin import ReadOnlyAdmin
from audit.context import stamped
from bcd.contract import ids
from compute.core.api.registry import Resource
from compute.core.errors import ComputeError, Unauthenticated
from compute.platform import iam
from compute.platform.models import (
    ApiToken,
    Event,
    EventHead,
    IamUsage,
    IdempotencyRecord,
    OidcIdentity,
    Principal,
    RefusalBudget,
    RoleBinding,
    ShardLease,
    StreamLease,
    Tenant,
    WorkerPresence,
    WorkItem,
)
from compute.platform.tenancy.selectors import principal_for_user
from compute.platform.tenancy.services import token_revoke

Service = Callable[[Tenant, Principal, Any], object]


def audited_action(action: str, label: str, *, tenant_of: Callable[[Any], Tenant],
                   service: Service) -> Callable[..., None]:
    """An admin action that runs `service(tenant, actor, row)` for each selected row as the
    signed-in user's principal, when IAM allows `action` on the row's tenant; a refusal is
    audited as one from the API would be."""

    def run(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
        try:
            principal = principal_for_user(request.user)
        except Unauthenticated as refused:
            modeladmin.message_user(request, refused.message, messages.ERROR)
            return
        for row in queryset:
            tenant = tenant_of(row)
            resource = Resource(kind=action.partition(".")[0], tenant_id=tenant.id, id=row.pk)
            try:
                stamp = iam.decide_or_refuse(principal, action, resource, tenant_id=tenant.id,
                                             request_id=ids.new("req"), origin="admin")
                with stamped(stamp):
                    service(tenant, principal, row)
            except ComputeError as refused:  # IAM's refusal (audited) or the service's
                modeladmin.message_user(request, f"{row.pk}: {refused.message}",
                                        messages.ERROR)
                continue
            modeladmin.message_user(request, f"{row.pk}: {label}", messages.SUCCESS)

    run.__name__ = action.replace(".", "_")
    return admin.action(description=label)(run)


ADMIN_REASON = "from the Django admin"


@admin.register(Tenant)
class TenantAdmin(ReadOnlyAdmin):
    list_display = ("id", "slug", "name", "parent", "created_at")
    search_fields = ("id", "slug", "name")


@admin.register(Principal)
class PrincipalAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "tenant", "kind", "disabled_at")
    list_filter = ("kind", "tenant")
    search_fields = ("id", "name")


@admin.register(RoleBinding)
class RoleBindingAdmin(ReadOnlyAdmin):
    list_display = ("principal", "tenant", "role")
    list_filter = ("role", "tenant")
    search_fields = ("principal__id", "principal__name")


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "principal", "expires_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("id", "name", "principal__id")
    exclude = ("secret_sha256",)
    actions = [audited_action(
        "tokens.revoke", "Revoke the selected tokens",
        tenant_of=lambda token: token.principal.tenant,
        service=lambda tenant, actor, token: token_revoke(tenant=tenant, actor=actor,
                                                          token_id=token.pk))]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("seq", "position", "type", "tenant", "subject", "created_at")
    list_filter = ("type", "tenant")
    search_fields = ("id", "subject", "type")


@admin.register(EventHead)
class EventHeadAdmin(ReadOnlyAdmin):
    list_display = ("tenant_id", "size")
    search_fields = ("tenant_id",)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "scope", "key", "object_id", "created_at")
    list_filter = ("scope",)
    search_fields = ("key", "object_id")


@admin.register(WorkItem)
class WorkItemAdmin(ReadOnlyAdmin):
    list_display = ("kind", "key", "shard", "due_at", "attempts", "last_error")
    list_filter = ("kind",)
    search_fields = ("key",)


@admin.register(ShardLease)
class ShardLeaseAdmin(ReadOnlyAdmin):
    list_display = ("shard", "owner", "expires_at")
    search_fields = ("owner",)


@admin.register(WorkerPresence)
class WorkerPresenceAdmin(ReadOnlyAdmin):
    list_display = ("owner", "expires_at")
    search_fields = ("owner",)


@admin.register(RefusalBudget)
class RefusalBudgetAdmin(ReadOnlyAdmin):
    list_display = ("principal_id", "tokens", "updated_at")
    search_fields = ("principal_id",)


@admin.register(StreamLease)
class StreamLeaseAdmin(ReadOnlyAdmin):
    list_display = ("principal_id", "tenant_id", "expires_at")
    search_fields = ("principal_id", "tenant_id")


def _read_only_everywhere(app_label: str) -> None:
    """Another app's admin pages, made view-only (django-q2's schedules run the audit
    checkpoints, so they change through `manage.py bc_schedules`, not a form)."""
    for model, model_admin in list(admin.site._registry.items()):
        if model._meta.app_label == app_label:
            admin.site.unregister(model)
            admin.site.register(model, type(type(model_admin).__name__,
                                            (ReadOnlyAdmin, type(model_admin)), {}))


_read_only_everywhere("django_q")


@admin.register(IamUsage)
class IamUsageAdmin(ReadOnlyAdmin):
    list_display = ("record_id", "tenant", "meter", "quantity", "window_start", "window_end")
    search_fields = ("record_id", "tenant__slug", "meter")


@admin.register(OidcIdentity)
class OidcIdentityAdmin(ReadOnlyAdmin):
    list_display = ("subject", "issuer", "principal", "created_at")
    search_fields = ("subject", "issuer", "principal__id")
