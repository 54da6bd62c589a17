"""The registry of role grants: which role may call which API methods, declared by the app
that owns the methods (its `grants.py`), collected when the apps load (`compute.platform.apps`).

Roles are ordered `viewer` < `member` < `operator` < `admin`: what a role is granted, every
role above it has too, and `admin` may call everything. Actions are globs over
`<group>.<method>`.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

ROLES = ("viewer", "member", "operator", "admin")
# role -> the globs granted to it (not counting what lower roles were granted). Every app's
# `get` and `list` methods are reads, which every role may call.
GRANTED: dict[str, list[str]] = {role: [] for role in ROLES}
GRANTED["viewer"] += ["*.get", "*.list"]
# Actions that only a binding on the root tenant grants, whatever the role elsewhere.
ROOT_ONLY: list[str] = []
# Actions of admins only, even where a glob granted to a lower role covers them.
ADMIN_ONLY: list[str] = []


def grant(role: str, *actions: str) -> None:
    """`role` (and every role above it) may call `actions`."""
    if role not in GRANTED:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    GRANTED[role].extend(a for a in actions if a not in GRANTED[role])


def root_only(*actions: str) -> None:
    """`actions` need a role on the root tenant (creating tenants and sites)."""
    ROOT_ONLY.extend(a for a in actions if a not in ROOT_ONLY)


def admin_only(*actions: str) -> None:
    """`actions` are for admins alone (who holds which tokens)."""
    ADMIN_ONLY.extend(a for a in actions if a not in ADMIN_ONLY)


def role_actions(role: str) -> tuple[str, ...]:
    """Every glob `role` may call: its own grants and those of the roles below it."""
    if role == "admin":
        return ("*",)
    if role not in GRANTED:
        return ()
    below = ROLES[:ROLES.index(role) + 1]
    return tuple(glob for r in below for glob in GRANTED[r])


def allows(role: str, action: str) -> bool:
    if role != "admin" and any(fnmatchcase(action, p) for p in ADMIN_ONLY):
        return False
    return any(fnmatchcase(action, pattern) for pattern in role_actions(role))


def is_root_only(action: str) -> bool:
    return any(fnmatchcase(action, pattern) for pattern in ROOT_ONLY)
