"""How many refusals a caller may collect: a token bucket per principal, in Postgres (every
API process shares it). Each refused call takes a token; with none left the caller is
answered 429 and its refusals stop being written to the audit log one by one (a flood of
probes would otherwise fill it): the refusal that empties the bucket is audited as the start
of the throttling. Allowed calls are never limited here. Failed authentications (a bad or
revoked token) are limited the same way per source address; once throttled, an address is
answered 429 before any token it sends is looked at."""

from __future__ import annotations

import hashlib
import math
import time

from django.conf import settings
from django.db import connection, models, transaction

from audit.services import audit_denied
from compute.core.errors import TooManyRequests


class RefusalBudget(models.Model):
    principal_id = models.CharField(max_length=40, primary_key=True)
    tokens = models.FloatField()
    updated_at = models.DateTimeField()

    class Meta:
        app_label = "compute"

    def __str__(self) -> str:
        return f"{self.principal_id}: {self.tokens:.1f} refusals left"


def _take_token(principal_id: str, burst: int | None = None,
                per_minute: int | None = None) -> tuple[float, float]:
    """Refill the bucket `principal_id` (a caller's, or an address's) for the time since its
    last take and take one token (never below -1, so a throttled caller is back within one
    refill interval); the tokens before the take (refilled) and after."""
    burst = settings.BC_REFUSAL_BURST if burst is None else burst
    per_second = (settings.BC_REFUSALS_PER_MINUTE if per_minute is None else per_minute) / 60
    table = RefusalBudget._meta.db_table

    def refilled(row: str) -> str:
        return (f"LEAST(%(burst)s, {row}.tokens + %(rate)s * "
                f"EXTRACT(EPOCH FROM now() - {row}.updated_at))")

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"WITH old AS (SELECT * FROM {table} WHERE principal_id = %(id)s FOR NO KEY UPDATE), "  # noqa: S608
            f"taken AS (INSERT INTO {table} AS b (principal_id, tokens, updated_at) "
            "VALUES (%(id)s, %(burst)s - 1, now()) ON CONFLICT (principal_id) DO UPDATE SET "
            f"tokens = GREATEST(-1, {refilled('b')} - 1), updated_at = now() "
            "RETURNING tokens) "
            f"SELECT COALESCE((SELECT {refilled('old')} FROM old), %(burst)s), "
            "(SELECT tokens FROM taken)",
            {"id": principal_id, "burst": burst, "rate": per_second})
        before, after = cursor.fetchone()
    return float(before), float(after)


def refusal_recorded(*, principal_id: str, tenant_id: str, action: str, target: str,
                     reason: str) -> None:
    """Audit one refusal in `tenant_id`, or raise TooManyRequests when the caller has had
    too many lately."""
    before, after = _take_token(principal_id)
    if after >= 0:
        audit_denied(tenant_id=tenant_id, actor_id=principal_id, action=action, target=target,
                     reason=reason)
        return
    wait = math.ceil(-after * 60 / settings.BC_REFUSALS_PER_MINUTE)
    if before >= 0:  # this refusal empties the bucket: the throttling starts, once audited
        audit_denied(tenant_id=tenant_id, actor_id=principal_id, action=action, target=target,
                     reason=f"{reason}; further refusals throttled",
                     data={"throttled": True})
    raise TooManyRequests(f"too many refused calls from this caller; try again in {wait} s",
                          retryAfterSeconds=wait)


# Addresses whose failed authentications emptied their bucket: until when (monotonic), so a
# throttled address is answered 429 here without its token being looked at.
_THROTTLED: dict[str, float] = {}


def authentication_throttled(address: str) -> None:
    """TooManyRequests while `address` is throttled for failed authentications."""
    until = _THROTTLED.get(address)
    if until is not None:
        left = until - time.monotonic()
        if left > 0:
            raise TooManyRequests("too many failed authentications from this address; try "
                                  f"again in {math.ceil(left)} s",
                                  retryAfterSeconds=math.ceil(left))
        del _THROTTLED[address]


def authentication_failed(address: str) -> None:
    """Count a failed authentication of `address` (a bucket per address shared by every
    process); TooManyRequests once it has had too many lately."""
    per_minute = settings.BC_AUTH_FAILURES_PER_MINUTE
    key = "address:" + hashlib.sha256(address.encode()).hexdigest()[:24]
    _, after = _take_token(key, settings.BC_AUTH_FAILURE_BURST, per_minute)
    if after < 0:
        wait = math.ceil(-after * 60 / per_minute)
        _THROTTLED[address] = time.monotonic() + wait
        if len(_THROTTLED) > 100_000:
            _THROTTLED.clear()
        raise TooManyRequests("too many failed authentications from this address; try "
                              f"again in {wait} s", retryAfterSeconds=wait)
