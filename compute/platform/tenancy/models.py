"""Tenants, principals, their API tokens and role bindings (the embedded IAM's data)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from compute.core.fields import id_field

ROOT_TENANT_SLUG = "root"
TOKEN_SCHEME = "biam"  # noqa: S105 (the API token prefix, not a secret)


class Tenant(models.Model):
    """An isolated owner of objects. `root` is the platform operator; others sit under it."""

    id = id_field("tnt")
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_root(self) -> bool:
        return self.slug == ROOT_TENANT_SLUG


class Role(models.TextChoices):
    ADMIN = "admin"
    OPERATOR = "operator"
    MEMBER = "member"
    VIEWER = "viewer"


class Principal(models.Model):
    """Someone or something that calls the API: a person or a service account."""

    class Kind(models.TextChoices):
        USER = "user"
        SERVICE = "service"

    id = id_field("prn")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="principals")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.SERVICE)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="principal", help_text="Django user for browser sessions (console, admin).")
    created_at = models.DateTimeField(default=timezone.now)
    disabled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class RoleBinding(models.Model):
    """`principal` holds `role` in `tenant`. A binding in the root tenant reaches every tenant."""

    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="bindings")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="bindings")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "tenant"],
                                    name="compute_rolebinding_one_per_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.principal_id} {self.role} in {self.tenant_id}"


class OidcIdentity(models.Model):
    """The principal an OpenID Connect subject of an issuer acts as (compute.platform.iam.oidc):
    made on its first call, its role bindings kept to what its groups map to."""

    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    principal = models.OneToOneField(Principal, on_delete=models.CASCADE,
                                     related_name="oidc_identity")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "OIDC identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"],
                                               name="compute_oidc_identity_once")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class ApiToken(models.Model):
    """A bearer token `biam_<id>.<secret>`. Only the SHA-256 of the secret is kept."""

    id = id_field("tok")
    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=200, blank=True)
    secret_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.id
