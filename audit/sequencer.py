"""Positions for audit rows, given after their transactions commit.

A write service inserts its audit row without a position, stamped with its transaction's
id (`txid`), and takes no lock that another writer of the tenant needs. The sequencer then
numbers a tenant's rows whose transactions are older than every transaction still in
flight, in (txid, seq) order: such rows can no longer be joined by an earlier one, so each
pass appends to the log, positions stay 1, 2, 3… with no gap (a rolled-back row never
existed) and, once given, never change. The leaf hash, which covers the position, is
written with it. One sequencer per tenant at a time: it holds the tenant's AuditHead row.

Readers of positions (audit list, prove, verify, the checkpoint sealer) number what has
settled before they read; a minute's job numbers the rest.
"""

from __future__ import annotations

from django.db import IntegrityError, connection, transaction

from audit.models import AuditEvent, AuditHead
from bcd.contract.auditproof import event_leaf
from compute.core.db import constraint_name, settled
from compute.core.errors import PreconditionFailed
from compute.core.sqltext import tables

ONE_PER_POSITION = "audit_auditevent_one_per_position"

NUMBERED_SQL = tables("""
UPDATE {AuditEvent} SET position = given.position, leaf_hash = given.leaf_hash
  FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS given(seq, position, leaf_hash)
 WHERE {AuditEvent}.seq = given.seq""", AuditEvent=AuditEvent)


def audit_sequence(*, tenant_id: str) -> int:
    """Number the tenant's settled rows that have no position yet; how many it numbered."""
    if not _waiting(tenant_id):
        return 0
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(tables("INSERT INTO {AuditHead} (tenant_id, size) VALUES (%s, 0) "
                           "ON CONFLICT (tenant_id) DO NOTHING", AuditHead=AuditHead), [tenant_id])
            cursor.execute(tables("SELECT size FROM {AuditHead} WHERE tenant_id = %s "
                                  "FOR NO KEY UPDATE",
                AuditHead=AuditHead),
                           [tenant_id])
            size = int(cursor.fetchone()[0])
        rows = list(AuditEvent.objects.filter(tenant_id=tenant_id, position__isnull=True)
                    .filter(settled()).order_by("txid", "seq"))
        if not rows:
            return 0
        for offset, row in enumerate(rows, start=1):
            row.position = size + offset
            row.leaf_hash = event_leaf(row.wire()).hex()
        with connection.cursor() as cursor:
            try:
                cursor.execute(NUMBERED_SQL, [[r.seq for r in rows],
                                              [r.position for r in rows],
                                              [r.leaf_hash for r in rows]])
            except IntegrityError as error:  # not a ledger conflict: not counted as one
                if constraint_name(error) != ONE_PER_POSITION:
                    raise
                raise PreconditionFailed(
                    f"audit position {size + 1} or after is already taken: the log was "
                    "edited; run audit verify", tenantId=tenant_id) from error
            cursor.execute(tables("UPDATE {AuditHead} SET size = %s WHERE tenant_id = %s",
                AuditHead=AuditHead),
                           [size + len(rows), tenant_id])
    return len(rows)


def audit_sequence_all() -> int:
    """Number every tenant's settled rows (the minute's job); how many in all."""
    tenants = (AuditEvent.objects.filter(position__isnull=True).values_list("tenant_id",
                                                                              flat=True)
               .distinct())
    return sum(audit_sequence(tenant_id=tenant_id) for tenant_id in list(tenants))


def _waiting(tenant_id: str) -> bool:
    return AuditEvent.objects.filter(tenant_id=tenant_id, position__isnull=True).exists()
