"""The embedded IAM: roles bound per tenant, a root binding reaching every tenant."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from compute.api.registry import Resource
from compute.db import prepared_cursor
from compute.iam import Decision
from compute.tenancy.models import ROOT_TENANT_SLUG, Principal, Role

_READ = ("*.get", "*.list", "events.watch", "system.whoami", "capacity.*", "pki.show", "usage.*",
         "nodes.events", "audit.verify", "audit.prove", "audit.checkpoints")

# What each role may do, as globs over "<group>.<method>". Later roles include earlier ones.
ROLE_ACTIONS: dict[str, tuple[str, ...]] = {
    Role.VIEWER: _READ,
    Role.MEMBER: (*_READ, "reservations.*", "series.*", "sandboxes.*"),
    Role.OPERATOR: (*_READ, "reservations.*", "series.*", "sandboxes.*", "sites.*", "pools.*",
                    "nodes.*", "maintenance.*", "joinTokens.*", "offerings.*"),
    Role.ADMIN: ("*",),
}

BINDINGS_SQL = """
SELECT b.tenant_id, b.role, t.slug FROM compute_rolebinding b
  JOIN compute_tenant t ON t.id = b.tenant_id WHERE b.principal_id = %s"""

# Actions that only a binding on the root tenant grants, whatever the role elsewhere.
ROOT_ONLY = ("tenants.create", "sites.create")
# Actions of admins only, though they read: who holds which tokens.
ADMIN_ONLY = ("tokens.*",)


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
        if any(fnmatchcase(action, pattern) for pattern in ROOT_ONLY):
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
        if role != Role.ADMIN and any(fnmatchcase(action, p) for p in ADMIN_ONLY):
            return False
        return any(fnmatchcase(action, pattern) for pattern in ROLE_ACTIONS.get(role, ()))
