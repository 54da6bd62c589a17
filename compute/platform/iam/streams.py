"""How many event streams a caller and a tenant may hold, counted across every API process.

A stream holds a lease row while it lives: taken when it opens (refused past the limits,
429 with Retry-After), renewed while it streams, dropped when it ends. A process that dies
leaves its leases to expire within LEASE. Counting is serialized per caller and per tenant
with transaction-scoped advisory locks (caller first, then tenant: one order for all).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models.functions import Now

from compute.core.errors import TooManyRequests

LEASE = timedelta(seconds=60)  # streams renew at every keep-alive (15 s) or page


class StreamLease(models.Model):
    principal_id = models.CharField(max_length=40)
    tenant_id = models.CharField(max_length=40)
    expires_at = models.DateTimeField()

    class Meta:
        app_label = "compute"
        indexes = [models.Index(fields=["tenant_id", "expires_at"], name="stream_tenant"),
                   models.Index(fields=["principal_id", "expires_at"], name="stream_caller")]

    def __str__(self) -> str:
        return f"stream of {self.principal_id} in {self.tenant_id}"


def stream_lease_take(*, principal_id: str, tenant_id: str) -> int:
    """A lease for one more stream of this caller in this tenant, or TooManyRequests."""
    per_caller, per_tenant = settings.BC_STREAMS_PER_CALLER, settings.BC_STREAMS_PER_TENANT
    table = StreamLease._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('bc_streams_caller'), "
                       "hashtext(%s)), pg_advisory_xact_lock(hashtext('bc_streams_tenant'), "
                       "hashtext(%s))", [principal_id, tenant_id])
        cursor.execute(f"SELECT count(*) FILTER (WHERE principal_id = %s), "  # noqa: S608
                       f"count(*) FILTER (WHERE tenant_id = %s) FROM {table} "
                       "WHERE (principal_id = %s OR tenant_id = %s) AND expires_at > now()",
                       [principal_id, tenant_id, principal_id, tenant_id])
        mine, tenants = cursor.fetchone()
        if mine >= per_caller:
            raise TooManyRequests(f"at most {per_caller} event streams per caller",
                                  limit=per_caller, retryAfterSeconds=5)
        if tenants >= per_tenant:
            raise TooManyRequests(f"at most {per_tenant} event streams per tenant",
                                  limit=per_tenant, retryAfterSeconds=5)
        cursor.execute(f"DELETE FROM {table} WHERE expires_at < now() - interval '1 minute'")  # noqa: S608
        cursor.execute(f"INSERT INTO {table} (principal_id, tenant_id, expires_at) "  # noqa: S608
                       "VALUES (%s, %s, now() + make_interval(secs => %s)) RETURNING id",
                       [principal_id, tenant_id, LEASE.total_seconds()])
        return int(cursor.fetchone()[0])


def stream_lease_renew(lease_id: int) -> None:
    StreamLease.objects.filter(pk=lease_id).update(expires_at=Now() + LEASE)


def stream_lease_drop(lease_id: int) -> None:
    StreamLease.objects.filter(pk=lease_id).delete()
