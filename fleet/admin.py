from django.contrib import admin

from audit.admin import ReadOnlyAdmin, ReadOnlyInline
from compute.platform.admin import ADMIN_REASON, audited_action
from compute.platform.tenancy.models import Tenant
from fleet.models import (
    Device,
    GpuSample,
    Image,
    JoinToken,
    Node,
    NodeCommand,
    NodeReport,
    NodeSpec,
    Pool,
    ReportInbox,
    Site,
    SpentSeal,
)
from fleet.services.join_tokens import join_token_revoke
from fleet.services.lifecycle import node_adopt_again
from fleet.services.nodes import node_cordon, node_uncordon


def _pool_tenant(row: Node | JoinToken) -> Tenant:
    return row.pool.tenant


@admin.register(Site)
class SiteAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "kind", "region", "tenant", "created_at")
    list_filter = ("kind", "region")
    search_fields = ("id", "name", "region")


@admin.register(Pool)
class PoolAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "pool_class", "gpu_model", "site", "tenant")
    list_filter = ("pool_class", "gpu_model", "site")
    search_fields = ("id", "name", "gpu_model")


class DeviceInline(ReadOnlyInline):
    model = Device
    fields = ("uuid", "index", "product", "nvlink_domain", "health", "present")
    readonly_fields = fields


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ("id", "hostname", "pool", "role", "provision_state", "connectivity",
                    "health", "cordoned", "vcpus_allocated", "vcpus")
    list_filter = ("role", "provision_state", "connectivity", "health", "cordoned", "pool")
    search_fields = ("id", "hostname", "serial", "product_uuid")
    inlines = [DeviceInline]
    actions = [
        audited_action("nodes.cordon", "Cordon the selected nodes", tenant_of=_pool_tenant,
                       service=lambda tenant, actor, node: node_cordon(
                           tenant=tenant, actor=actor, node_id=node.pk, reason=ADMIN_REASON)),
        audited_action("nodes.uncordon", "Uncordon the selected nodes", tenant_of=_pool_tenant,
                       service=lambda tenant, actor, node: node_uncordon(
                           tenant=tenant, actor=actor, node_id=node.pk, reason=ADMIN_REASON)),
        audited_action("nodes.adopt", "Adopt the selected nodes again", tenant_of=_pool_tenant,
                       service=lambda tenant, actor, node: node_adopt_again(
                           tenant=tenant, actor=actor, node_id=node.pk, reason=ADMIN_REASON)),
    ]


@admin.register(Device)
class DeviceAdmin(ReadOnlyAdmin):
    list_display = ("id", "uuid", "node", "device_class", "index", "profile", "product",
                    "nvlink_domain", "health", "present")
    list_filter = ("model", "health", "present", "device_class")
    search_fields = ("id", "uuid", "node__id", "node__hostname")


@admin.register(GpuSample)
class GpuSampleAdmin(ReadOnlyAdmin):
    list_display = ("device", "at", "utilization", "memory_used_mib")
    search_fields = ("device__uuid", "device__node__id")


@admin.register(JoinToken)
class JoinTokenAdmin(ReadOnlyAdmin):
    list_display = ("id", "pool", "uses", "max_uses", "expires_at", "revoked_at")
    list_filter = ("pool",)
    search_fields = ("id", "expect_serial", "expect_product_uuid", "expect_mac")
    exclude = ("secret_sha256",)
    actions = [audited_action(
        "joinTokens.revoke", "Revoke the selected join tokens", tenant_of=_pool_tenant,
        service=lambda tenant, actor, token: join_token_revoke(tenant=tenant, actor=actor,
                                                               token_id=token.pk))]


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


@admin.register(ReportInbox)
class ReportInboxAdmin(ReadOnlyAdmin):
    list_display = ("id", "node", "kind", "epoch", "received_at")
    list_filter = ("kind",)
    search_fields = ("node__id",)


@admin.register(NodeSpec)
class NodeSpecAdmin(ReadOnlyAdmin):
    list_display = ("node", "generation", "created_at")
    search_fields = ("node__id",)


@admin.register(Image)
class ImageAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "pool", "created_at")
    list_filter = ("pool",)
    search_fields = ("id", "name")


@admin.register(SpentSeal)
class SpentSealAdmin(ReadOnlyAdmin):
    list_display = ("digest", "token", "created_at")
    search_fields = ("digest", "token__id")
