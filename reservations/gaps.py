"""Free time of whole GPU groups, kept beside the bookings it is derived from.

A group is a node's GPUs, or the GPUs of one of its NVLink domains. A gap is a maximal
stretch of time in which no booking holds any GPU of the group, nor any part of one (a MIG
instance, a share, a maintenance window): every GPU of the group is free all along. The
earliest slot for a whole node or a whole NVLink set reads these gaps instead of sweeping
every booking in its range.

Only Postgres writes them (migration 0014). Every statement that writes bookings ends in
a trigger that marks, in the booker's own transaction, the time it changed in each group as
stale (a GPU moved to another node or NVLink domain marks both groups whole); a booker
does nothing more, so booking costs one small insert. Menders (a work item per marked
node, queued by the workers' sweep) recompute the marked spans from the bookings and drop
the marks, one mender per node at a time on an advisory lock that bookers never take.
Readers trust the gaps of unmarked nodes only, and sweep a marked node's bookings as for
any other node: a mark and the booking it stands for commit together. A group without any
gap row has never been booked: it is free all along. Gaps that ended over a day ago are
dropped as the group's gaps are rewritten.
"""

from __future__ import annotations

from compute.core.sqltext import tables
from fleet.models.devices import Device
from reservations.models import Booking, GroupGap, StaleGaps


def stale_nodes(limit: int = 500) -> list[str]:
    """Nodes with gaps to mend."""
    return list(StaleGaps.objects.values_list("node_id", flat=True).distinct()
                .order_by("node_id")[:limit])


def gaps_mend(node_ids: list[str] | None = None) -> int:
    """Recompute the stale gaps of these nodes (default: every node marked), waiting for
    any other mender of the same node; how many marks were mended."""
    from django.db import connection, transaction

    nodes = stale_nodes(limit=100_000) if node_ids is None else node_ids
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT reservations_groupgap_mend(%s::varchar[])", [nodes])
        return int(cursor.fetchone()[0])


# Gaps that differ from the free time recomputed from the bookings and today's devices
# (both sides from a day ago on, as older gaps are dropped; a group free all along has no
# row), on nodes not marked stale: 0 when the menders kept up.
GAP_DRIFT_SQL = tables("""
WITH truth AS (
  SELECT x.node_id, x.domain, lower(f) AS lo, upper(f) AS hi FROM (
    SELECT d.node_id, grp.domain,
           tstzmultirange(tstzrange('-infinity', 'infinity')) - range_agg(b.during) AS free
      FROM {Booking} b JOIN {Device} d ON d.id = b.gpu_id
     CROSS JOIN LATERAL (VALUES (''), (d.nvlink_domain)) grp(domain)
     WHERE grp.domain = '' OR d.nvlink_domain <> ''
     GROUP BY d.node_id, grp.domain) x, unnest(x.free) f
   WHERE upper(f) >= now() - interval '1 day' AND f <> tstzrange('-infinity', 'infinity')
     AND x.node_id NOT IN (SELECT node_id FROM {StaleGaps})),
kept AS (
  SELECT node_id, domain, lo, hi FROM {GroupGap}
   WHERE hi >= now() - interval '1 day'
     AND node_id NOT IN (SELECT node_id FROM {StaleGaps}))
SELECT (SELECT count(*) FROM (SELECT * FROM truth EXCEPT ALL SELECT * FROM kept) missing)
     + (SELECT count(*) FROM (SELECT * FROM kept EXCEPT ALL SELECT * FROM truth) extra)""",
         Booking=Booking, Device=Device, GroupGap=GroupGap, StaleGaps=StaleGaps)
