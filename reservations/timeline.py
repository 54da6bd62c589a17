"""A pool's ledger over a window of time, as the console's calendar draws it and
`capacity.timeline` returns it: a row per device (GPUs grouped by node and NVLink domain,
their MIG instances and shares under them), the bookings on those devices as bars, the
pending queue at its planned or earliest start, and utilisation per step: GPU-hours booked
and bookable from the ledger, and measured utilisation from the agents' samples.

Who sees what: the pool's owner sees every booking with its tenant; a tenant the pool is
offered to sees its own bookings, and everyone else's as `busy` (device and window only).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from compute.core.errors import InvalidArgument
from compute.core.sqltext import tables
from compute.platform.tenancy.models import Tenant
from fleet.models import Device, GpuSample, Node, NodeRole, Pool
from fleet.presenters import unschedulable_because
from reservations.earliest import search_for
from reservations.models import Booking, Reservation, ReservationState
from reservations.shape import Ask, Shape
from reservations.sharing import waiting_queue

MAX_SPAN = timedelta(days=92)
MAX_STEPS = 500
MIN_STEP = timedelta(minutes=1)
MAX_ROWS = 2000
SEARCHED = 10  # pending requests given an earliest start (the first in queue order)


@dataclass(frozen=True)
class Span:
    """The window asked for, cut in steps of `step` (the last one may be shorter)."""

    start: datetime
    end: datetime
    step: timedelta

    @classmethod
    def of(cls, start: datetime, end: datetime, step_ms: int | None) -> Span:
        if end <= start:
            raise InvalidArgument("to: must be after from", field="to")
        if end - start > MAX_SPAN:
            raise InvalidArgument(f"to: at most {MAX_SPAN.days} days after from", field="to")
        step = (timedelta(milliseconds=step_ms) if step_ms
                else max(MIN_STEP, (end - start) / 96))
        if (end - start) / step > MAX_STEPS:
            raise InvalidArgument(f"resolution: at most {MAX_STEPS} steps in the window "
                                  f"(at least {(end - start) / MAX_STEPS} each)",
                                  field="resolution")
        return cls(start, end, step)

    def steps(self) -> list[tuple[datetime, datetime]]:
        edges, at = [], self.start
        while at < self.end:
            edges.append((at, min(at + self.step, self.end)))
            at += self.step
        return edges


def pool_timeline(pool: Pool, *, viewer: Tenant, span: Span, now: datetime) -> dict[str, Any]:
    """What the calendar draws for `pool` over `span`, as `viewer` may see it."""
    owner = pool.tenant_id == viewer.id
    rows = device_rows(pool)
    return {"poolId": pool.id, "from": span.start, "to": span.end,
            "resolution": int(span.step.total_seconds() * 1000), "now": now,
            "rows": rows[:MAX_ROWS], "truncated": len(rows) > MAX_ROWS,
            "bars": bars(pool, span, viewer=viewer, owner=owner),
            "pending": waiting(pool, now, viewer=viewer, owner=owner),
            "utilisation": utilisation(pool, span)}


def device_rows(pool: Pool) -> list[dict[str, Any]]:
    """The pool's present devices, a row each: by node, NVLink domain and index, each GPU
    followed by its MIG instances and shares."""
    devices = list(Device.objects.filter(node__pool=pool, node__role=NodeRole.NODE,
                                         present=True).select_related("node")
                   .order_by("node__hostname", "node_id", "index", "id"))
    parts: dict[str, list[Device]] = {}
    for device in devices:
        if device.parent_id:
            parts.setdefault(device.parent_id, []).append(device)
    gpus = sorted((d for d in devices if not d.parent_id),
                  key=lambda d: (d.node.hostname, d.node_id, d.nvlink_domain, d.index))
    rows = []
    for gpu in gpus:
        rows.append(device_row(gpu))
        rows += [device_row(part) for part in sorted(parts.get(gpu.id, []),
                                                     key=lambda d: (d.profile, d.uuid))]
    return rows


def device_row(device: Device) -> dict[str, Any]:
    node = device.node
    why = unschedulable_because(node)
    if device.health != "healthy":
        why = "; ".join(filter(lambda w: w != "ok", [
            why, f"device {device.health}" + (f": {device.health_reason}"
                                              if device.health_reason else "")]))
    return {"id": device.id, "uuid": device.uuid, "class": device.device_class,
            "index": device.index, "profile": device.profile or None,
            "parentId": device.parent_id, "nodeId": node.id, "node": node.hostname or node.id,
            "nvlinkDomain": device.nvlink_domain or None, "simulated": bool(node.simulated_root),
            "state": row_state(node.connectivity, node.provision_state, node.cordoned,
                               node.health, device.health),
            "why": why if why != "ok" else None}


def row_state(connectivity: str, provision_state: str, cordoned: bool, node_health: str,
              device_health: str) -> str:
    """One word per row, what matters most first."""
    if connectivity == "unreachable":
        return "unreachable"
    if provision_state != "adopted":
        return "provisioning"
    if node_health != "healthy" or device_health != "healthy":
        return "unhealthy"
    return "cordoned" if cordoned else "ok"


def bars(pool: Pool, span: Span, *, viewer: Tenant, owner: bool) -> list[dict[str, Any]]:
    """Every booking of the pool's devices that meets the window: a reservation's (with
    its id, tenant and state where the viewer may see them, else `busy`) or a maintenance
    window's."""
    found = (Booking.objects.filter(device__node__pool=pool, device__present=True,
                                    during__overlap=(span.start, span.end))
             .select_related("allocation__reservation__tenant", "maintenance")
             .order_by("device_id", "during"))
    drawn = []
    for booking in found:
        bar = {"deviceId": booking.device_id, "start": booking.during.lower,
               "end": booking.during.upper}
        if booking.maintenance is not None:
            drawn.append({**bar, "kind": "maintenance", "maintenanceId": booking.maintenance_id,
                          "reason": booking.maintenance.reason})
            continue
        if booking.allocation is None:  # never: a booking has one holder (a CHECK)
            continue
        rsv = booking.allocation.reservation
        if not owner and rsv.tenant_id != viewer.id:
            drawn.append({**bar, "kind": "busy"})
            continue
        drawn.append({**bar, "kind": "reservation", "reservationId": rsv.id,
                      "tenantId": rsv.tenant_id, "tenant": rsv.tenant.slug, "state": rsv.state,
                      "planned": rsv.planned, "priorityClass": rsv.priority_class})
    return drawn


def waiting(pool: Pool, now: datetime, *, viewer: Tenant, owner: bool
            ) -> list[dict[str, Any]]:
    """The pool's queue as the viewer may see it (the owner all of it, a tenant its own):
    planned starts where their GPUs are booked, and the first pending requests where the
    earliest-window search would put them now (nothing ahead of them taken into account)."""
    visible = [q for q in waiting_queue(pool, now) if owner or q.tenant_id == viewer.id]
    rows = {r.id: r for r in Reservation.objects.filter(pk__in=[q.reservation_id
                                                                for q in visible])}
    items = []
    for searched, entry in enumerate(visible):
        rsv = rows[entry.reservation_id]
        start, end, devices, how = None, None, [], "none"
        if rsv.state == ReservationState.PLACED and rsv.during is not None:
            start, end, how = rsv.during.lower, rsv.during.upper, "planned"
            devices = list(Booking.objects.filter(allocation__reservation=rsv,
                                                  allocation__ended_at__isnull=True)
                           .values_list("device_id", flat=True))
        elif searched < SEARCHED:
            slot = search_for(Ask(rsv.tenant_id, pool, Shape.of(rsv), rsv.duration_ms),
                              now, None, None).slot()
            if slot is not None:
                start, end, how = slot.during.lower, slot.during.upper, "earliest"
                devices = list(Device.objects.filter(pk__in=slot.choice.device_ids)
                               .values_list("id", flat=True))
        items.append({"reservationId": rsv.id, "tenantId": rsv.tenant_id,
                      "position": entry.position, "count": rsv.count,
                      "class": rsv.device_class, "why": entry.why(), "start": start,
                      "end": end, "startFrom": how, "deviceIds": sorted(devices)})
    return items


UTILISATION_SQL = tables("""
WITH steps AS (
    SELECT lower(step) AS at, step
    FROM unnest(%(starts)s::timestamptz[], %(ends)s::timestamptz[]) AS s(a, b),
         LATERAL (SELECT tstzrange(s.a, s.b) AS step) r
), gpus AS (
    SELECT d.id FROM {Device} d JOIN {Node} n ON n.id = d.node_id
    WHERE n.pool_id = %(pool)s AND n.role = 'node' AND d.present
      AND d.device_class = 'gpu'
), held AS (  -- per physical GPU and holder kind: the union of its booked time
    SELECT b.gpu_id, b.maintenance_id IS NOT NULL AS serviced, range_agg(b.during) AS times
    FROM {Booking} b
    WHERE b.gpu_id IN (SELECT id FROM gpus) AND b.during && tstzrange(%(start)s, %(end)s)
    GROUP BY b.gpu_id, serviced
), pieces AS (
    SELECT steps.at, held.serviced,
           sum(extract(epoch FROM upper(piece) - lower(piece))) AS seconds
    FROM steps JOIN held ON held.times && steps.step,
         LATERAL unnest(held.times * tstzmultirange(steps.step)) AS piece
    GROUP BY steps.at, held.serviced
), measured AS (  -- samples of GPUs booked by a reservation when they were taken
    SELECT steps.at, avg(s.utilization) AS percent, count(*) AS samples
    FROM steps JOIN {GpuSample} s ON s.at <@ steps.step
    WHERE s.device_id IN (SELECT id FROM gpus) AND EXISTS (
        SELECT 1 FROM {Booking} b
        WHERE b.gpu_id = s.device_id AND b.allocation_id IS NOT NULL AND b.during @> s.at)
    GROUP BY steps.at
)
SELECT steps.at, extract(epoch FROM upper(steps.step) - lower(steps.step)),
       (SELECT count(*) FROM gpus),
       coalesce((SELECT seconds FROM pieces p WHERE p.at = steps.at AND NOT p.serviced), 0),
       coalesce((SELECT seconds FROM pieces p WHERE p.at = steps.at AND p.serviced), 0),
       m.percent, coalesce(m.samples, 0)
FROM steps LEFT JOIN measured m ON m.at = steps.at
ORDER BY steps.at
""", Device=Device, Node=Node, Booking=Booking, GpuSample=GpuSample)


def utilisation(pool: Pool, span: Span) -> list[dict[str, Any]]:
    """Per step: the GPUs' hours, those a maintenance window takes (the rest are bookable),
    those reservations book (a GPU counts once whatever books it, whole or in parts), and
    the mean utilisation the agents measured on booked GPUs (none where no sample was kept:
    samples are kept a day)."""
    steps = span.steps()
    with connection.cursor() as cursor:
        cursor.execute(UTILISATION_SQL, {
            "pool": pool.id, "start": span.start, "end": span.end,
            "starts": [a for a, _ in steps], "ends": [b for _, b in steps]})
        found = cursor.fetchall()
    return [{"start": at, "end": at + timedelta(seconds=float(seconds)),
             "gpuHours": hours(gpus * float(seconds)),
             "allocatableGpuHours": hours(gpus * float(seconds) - float(serviced)),
             "allocatedGpuHours": hours(float(held)),
             "measuredUtilisation": round(float(percent), 1) if percent is not None else None,
             "samples": samples}
            for at, seconds, gpus, held, serviced, percent, samples in found]


def hours(seconds: float) -> float:
    return round(seconds / 3600, 4)

