"""Writes of tenants, principals and tokens: one durable transaction each, audited, evented."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from audit.services import audit_exempt, audit_record, audited
from compute.core import secrets
from compute.core.db import advisory_xact_lock, constraint_errors
from compute.core.errors import (
    AlreadyExists,
    InvalidArgument,
    InvalidState,
    NotFound,
    PermissionDenied,
)
from compute.platform.events.services import event_emit
from compute.platform.iam.oidc import Identity
from compute.platform.idempotency import idempotent_lookup, idempotent_remember
from compute.platform.tenancy.events import TenancyEvent
from compute.platform.tenancy.models import (
    ROOT_TENANT_SLUG,
    TOKEN_SCHEME,
    ApiToken,
    OidcIdentity,
    Principal,
    Role,
    RoleBinding,
    Tenant,
)
from compute.platform.tenancy.selectors import access_token_by_id, root_tenant


@dataclass(frozen=True)
class MintedToken:
    """A token row and its plaintext, which exists only in this object and the response."""

    token: ApiToken
    plaintext: str


@audited
def tenant_create(*, actor: Principal, slug: str, name: str = "",
                  idempotency_key: str | None = None) -> Tenant:
    """Create a customer tenant under root. Slugs are unique."""
    root = root_tenant()
    inputs = {"slug": slug, "name": name}
    existing = idempotent_lookup(tenant_id=root.id, scope="tenants.create",
                                 key=idempotency_key, inputs=inputs)
    if existing:
        return Tenant.objects.get(pk=existing)
    with constraint_errors({"compute_tenant_slug_key": lambda: AlreadyExists(
            f"tenant {slug!r} already exists", slug=slug)}):
        tenant = Tenant.objects.create(slug=slug, name=name or slug, parent=root)
    idempotent_remember(tenant_id=root.id, scope="tenants.create", key=idempotency_key,
                        inputs=inputs, object_id=tenant.id)
    audit_record(tenant_id=root.id, actor_id=actor.id, action="tenant.create",
                 target=tenant.id, data={"slug": slug})
    event_emit(tenant_id=root.id, type=TenancyEvent.TENANT_CREATED, subject=tenant.id,
               payload={"slug": slug})
    return tenant


def _mint(principal: Principal, *, name: str, ttl: timedelta | None) -> MintedToken:
    token = ApiToken(principal=principal, name=name,
                     expires_at=timezone.now() + ttl if ttl else None)
    plaintext, token.secret_sha256 = secrets.mint(TOKEN_SCHEME, token.id)
    token.save(force_insert=True)
    return MintedToken(token=token, plaintext=plaintext)


@audited
def token_create(*, tenant: Tenant, actor: Principal, name: str, role: str,
                 ttl: timedelta | None = None, principal_id: str | None = None) -> MintedToken:
    """Mint an API token: for an existing principal of `tenant` (it holds that principal's
    role, whatever `role` says), or for a new service principal holding `role` in `tenant`.
    The plaintext is returned once and never stored; the audit row names the role held."""
    if principal_id:
        principal = Principal.objects.filter(pk=principal_id, tenant=tenant).first()
        if principal is None:
            raise NotFound(f"principal {principal_id} not found", principalId=principal_id)
        role = (RoleBinding.objects.filter(principal=principal, tenant=tenant)
                .values_list("role", flat=True).first() or "")  # what the token will hold
    else:
        principal = Principal.objects.create(tenant=tenant, name=name,
                                             kind=Principal.Kind.SERVICE)
        RoleBinding.objects.create(principal=principal, tenant=tenant, role=role)
    minted = _mint(principal, name=name, ttl=ttl)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="token.create",
                 target=minted.token.id, data={"principalId": principal.id, "role": role})
    event_emit(tenant_id=tenant.id, type=TenancyEvent.TOKEN_CREATED, subject=minted.token.id,
               payload={"principalId": principal.id})
    return minted


@audited
def token_revoke(*, tenant: Tenant, actor: Principal, token_id: str) -> ApiToken:
    """Revoke a token; it fails authentication from the next request on."""
    token = access_token_by_id(tenant=tenant, token_id=token_id, lock=True)
    if token.revoked_at is not None:
        raise InvalidState(f"token {token_id} is already revoked", tokenId=token_id)
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="token.revoke", target=token.id)
    event_emit(tenant_id=tenant.id, type=TenancyEvent.TOKEN_REVOKED, subject=token.id)
    return token


@audited
def root_bootstrap(*, admin_name: str = "admin") -> MintedToken:
    """Make the root tenant if missing and mint a new root administrator token."""
    root, created = Tenant.objects.get_or_create(
        slug=ROOT_TENANT_SLUG, defaults={"name": "Platform operator"})
    principal = Principal.objects.create(tenant=root, name=admin_name,
                                         kind=Principal.Kind.SERVICE)
    RoleBinding.objects.create(principal=principal, tenant=root, role="admin")
    minted = _mint(principal, name=admin_name, ttl=None)
    audit_record(tenant_id=root.id, actor_id=principal.id, action="root.bootstrap",
                 target=minted.token.id, data={"tenantCreated": created}, reason="bootstrap")
    event_emit(tenant_id=root.id, type=TenancyEvent.TOKEN_CREATED, subject=minted.token.id,
               payload={"principalId": principal.id, "bootstrap": True})
    return minted


@audited
def user_create(*, tenant_slug: str, username: str, password: str, role: str,
                staff: bool = False) -> Principal:
    """A Django user who signs in to the console (and, when `staff`, the admin) as a new
    principal holding `role` in the tenant. Made by a server command, so it is its own actor."""
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        raise NotFound(f"tenant {tenant_slug} not found", tenant=tenant_slug)
    if role not in Role.values:
        raise InvalidArgument(f"role: one of {', '.join(Role.values)}", field="role")
    user_model = get_user_model()
    if user_model.objects.filter(username=username).exists():
        raise AlreadyExists(f"user {username} exists", username=username)
    user = user_model.objects.create_user(username=username, password=password,
                                          is_staff=staff, is_superuser=staff)
    principal = Principal.objects.create(tenant=tenant, name=username, user=user,
                                         kind=Principal.Kind.USER)
    RoleBinding.objects.create(principal=principal, tenant=tenant, role=role)
    audit_record(tenant_id=tenant.id, actor_id=principal.id, action="user.create",
                 target=principal.id, data={"username": username, "role": role,
                                            "staff": staff}, reason="server command")
    event_emit(tenant_id=tenant.id, type=TenancyEvent.USER_CREATED, subject=principal.id,
               payload={"username": username, "role": role})
    return principal


def oidc_principal(identity: Identity) -> Principal:
    """The principal of an OpenID Connect identity, with role bindings that are what its
    groups map to now; written (and audited) only when that changed."""
    if not identity.roles:
        raise PermissionDenied(f"{identity.name}: no group of this identity maps to a role "
                               "(BETTER_COMPUTE_OIDC_ROLES)")
    known = (OidcIdentity.objects.select_related("principal__tenant")
             .filter(issuer=identity.issuer, subject=identity.subject).first())
    if known is not None and _roles_of(known.principal) == identity.roles \
            and known.principal.disabled_at is None:
        return known.principal
    return oidc_principal_sync(identity)


def _roles_of(principal: Principal) -> dict[str, str]:
    return dict(RoleBinding.objects.filter(principal=principal)
                .values_list("tenant__slug", "role"))


@audited
def oidc_principal_sync(identity: Identity) -> Principal:
    """Make the identity's principal (homed in the root tenant if a group maps there, else
    in the first tenant named) and set its role bindings to its groups' roles."""
    advisory_xact_lock(f"oidc:{identity.issuer}:{identity.subject}")
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=identity.roles)}
    if not tenants:
        raise PermissionDenied(f"{identity.name}: the tenants its groups map to do not exist")
    known = (OidcIdentity.objects.select_related("principal")
             .filter(issuer=identity.issuer, subject=identity.subject).first())
    if known is not None and known.principal.disabled_at is None and _roles_of(
            known.principal) == identity.roles:  # another call made it so meanwhile
        audit_exempt("the identity's bindings are already what its groups map to")
        return Principal.objects.select_related("tenant").get(pk=known.principal_id)
    if known is None:
        home = tenants.get(ROOT_TENANT_SLUG) or tenants[sorted(tenants)[0]]
        principal = Principal.objects.create(tenant=home, name=identity.name,
                                             kind=Principal.Kind.USER)
        OidcIdentity.objects.create(issuer=identity.issuer, subject=identity.subject,
                                    principal=principal)
    else:
        principal = known.principal
    if principal.disabled_at is not None:
        raise PermissionDenied(f"{identity.name}: this principal is disabled")
    RoleBinding.objects.filter(principal=principal).exclude(
        tenant__slug__in=list(tenants)).delete()
    for slug, tenant in tenants.items():
        RoleBinding.objects.update_or_create(principal=principal, tenant=tenant,
                                             defaults={"role": identity.roles[slug]})
    audit_record(tenant_id=principal.tenant_id, actor_id=principal.id,
                 action="principal.oidc.sync", target=principal.id,
                 data={"issuer": identity.issuer, "subject": identity.subject,
                       "roles": {slug: identity.roles[slug] for slug in sorted(tenants)}})
    return Principal.objects.select_related("tenant").get(pk=principal.pk)
