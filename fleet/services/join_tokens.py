"""Join tokens: minted once (`bcjt_<id>.<secret>`), stored as a hash, revocable."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from audit.services import audit_record, audited
from compute.core import secrets
from compute.core.db import database_now
from compute.core.errors import InvalidArgument, InvalidState
from compute.platform.events.services import event_emit
from compute.platform.idempotency import idempotent_lookup, idempotent_remember
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.models import JoinToken
from fleet.selectors import access_join_token_by_id, access_pool_by_id

TOKEN_SCHEME = "bcjt"  # noqa: S105 (the token prefix, not a secret)
MIN_TTL = timedelta(minutes=1)
MAX_TTL = timedelta(hours=24)


@dataclass(frozen=True)
class MintedJoinToken:
    token: JoinToken
    plaintext: str | None  # None when an idempotent retry returns an existing token


@audited
def join_token_create(*, tenant: Tenant, actor: Principal, pool_id: str, ttl: timedelta,
                      max_uses: int = 1, expect_serial: str = "",
                      expect_product_uuid: str = "", expect_mac: str = "",
                      role: str = "node", idempotency_key: str | None = None
                      ) -> MintedJoinToken:
    """Mint a token that lets `max_uses` machines join the pool within `ttl` (1m..24h),
    as nodes or as the site's provisioners (`role`).

    The plaintext is returned once; a retry with the same idempotency key returns the same
    token without it.
    """
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise InvalidArgument("ttl: must be between 1m and 24h", field="ttl")
    inputs = {"pool_id": pool_id, "ttl": ttl.total_seconds(), "max_uses": max_uses,
              "expect_serial": expect_serial, "expect_product_uuid": expect_product_uuid,
              "expect_mac": expect_mac.lower(), "role": role}
    existing = idempotent_lookup(tenant_id=tenant.id, scope="joinTokens.create",
                                 key=idempotency_key, inputs=inputs)
    if existing:
        return MintedJoinToken(JoinToken.objects.get(pk=existing), None)
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id, owned=True)
    token = JoinToken(pool=pool, max_uses=max_uses, expires_at=database_now() + ttl,
                      expect_serial=expect_serial, expect_product_uuid=expect_product_uuid,
                      expect_mac=expect_mac.lower(), role=role)
    plaintext, token.secret_sha256 = secrets.mint(TOKEN_SCHEME, token.id)
    token.save(force_insert=True)
    idempotent_remember(tenant_id=tenant.id, scope="joinTokens.create", key=idempotency_key,
                        inputs=inputs, object_id=token.id)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="join_token.create",
                 target=token.id, data={"poolId": pool.id, "maxUses": max_uses,
                                        "bound": token.bound, "role": role})
    event_emit(tenant_id=tenant.id, type=FleetEvent.JOIN_TOKEN_CREATED, subject=token.id,
               payload={"poolId": pool.id})
    return MintedJoinToken(token, plaintext)


@audited
def join_token_revoke(*, tenant: Tenant, actor: Principal, token_id: str) -> JoinToken:
    token = access_join_token_by_id(tenant=tenant, token_id=token_id, lock=True)
    if token.revoked_at is not None:
        raise InvalidState(f"join token {token_id} is already revoked")
    token.revoked_at = database_now()
    token.save(update_fields=["revoked_at"])
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="join_token.revoke",
                 target=token.id)
    event_emit(tenant_id=tenant.id, type=FleetEvent.JOIN_TOKEN_REVOKED, subject=token.id)
    return token
