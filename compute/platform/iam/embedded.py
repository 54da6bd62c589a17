"""The embedded IAM: roles bound per tenant, a root binding reaching every tenant. What each
role may do is declared by the apps (`compute.core.api.grants`)."""

from __future__ import annotations

from typing import Any

from compute.core.api import grants
from compute.core.api.registry import Resource
from compute.core.db import prepared_cursor
from compute.core.sqltext import tables
from compute.platform.iam import Decision
from compute.platform.tenancy.models import ROOT_TENANT_SLUG, Principal, RoleBinding, Tenant

BINDINGS_SQL = tables("""
SELECT b.tenant_id, b.role, t.slug FROM {RoleBinding} b
  JOIN {Tenant} t ON t.id = b.tenant_id WHERE b.principal_id = %s""",
      RoleBinding=RoleBinding, Tenant=Tenant)


class EmbeddedIAM:
    def decide(self, principal: Principal, action: str, resource: Resource,
               context: dict[str, Any]) -> Decision:
        if principal.disabled_at is not None:
            return Decision(False, "principal is disabled")
        with prepared_cursor() as cursor:  # asked on every call: planned once
            cursor.execute(BINDINGS_SQL, [principal.id])
            bindings = {tenant_id: (role, slug) for tenant_id, role, slug in cursor.fetchall()}
        root_role = next(
            (role for role, slug in bindings.values() if slug == ROOT_TENANT_SLUG), None)
        if grants.is_root_only(action):
            return self._grant(root_role, action, "root tenant")
        local = bindings.get(resource.tenant_id, (None, ""))[0]
        for role, where in ((local, "tenant"), (root_role, "root tenant")):
            if role is not None and self._allows(role, action):
                return Decision(True, f"role {role} on the {where} allows {action}")
        return Decision(False, f"no role of {principal.id} allows {action} here")

    def _grant(self, role: str | None, action: str, where: str) -> Decision:
        if role is not None and self._allows(role, action):
            return Decision(True, f"role {role} on the {where} allows {action}")
        return Decision(False, f"{action} needs a role on the {where}")

    @staticmethod
    def _allows(role: str, action: str) -> bool:
        return grants.allows(role, action)
