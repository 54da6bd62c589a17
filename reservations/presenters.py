from __future__ import annotations

from typing import Any

from django.db.models import Count

from compute.core.api.shapes import (
    BOOLEAN,
    DATE,
    INTEGER,
    NUMBER,
    OBJECT,
    STRING,
    TIME,
    array,
    nullable,
    obj,
)
from reservations.models import (
    Offering,
    Reservation,
    ReservationSeries,
    ReservationState,
    Sandbox,
    UsageRecord,
)

LIMITS = {"type": "object", "properties": {
    "maxDurationHours": NUMBER, "maxStartAheadDays": NUMBER, "maxGpusAtOnce": INTEGER,
    "idleReclaim": obj(belowPercent=NUMBER, forMinutes=NUMBER, release=BOOLEAN,
                       graceMinutes=NUMBER),
    "budgets": array({"type": "object", "required": ["gpuHours", "period"],
                      "properties": {"gpuHours": NUMBER, "period": STRING,
                                     "priorityClass": STRING},
                      "additionalProperties": False})},
    "additionalProperties": False}
OFFERING = obj(id=STRING, poolId=STRING, tenantId=STRING, tenant=STRING,
               quota={"type": "object", "additionalProperties": obj(limit=INTEGER,
                                                                    used=INTEGER)},
               limits=LIMITS, share=INTEGER, priorityClasses=array(STRING), createdAt=TIME,
               updatedAt=TIME)
RESERVATION = obj(
    id=STRING, tenantId=STRING, poolId=STRING, state=STRING,
    devices=array(obj(**{"class": STRING, "count": INTEGER, "topology": STRING,
                         "profile": nullable(STRING)})),
    model=nullable(STRING), product=nullable(STRING), selector=nullable(STRING),
    kubernetes=BOOLEAN, slurm=nullable(STRING), priorityClass=STRING, borrowed=BOOLEAN,
    planned=BOOLEAN,
    preemptAt=nullable(TIME), bindingKind=STRING, start=nullable(TIME),
    end=nullable(TIME),
    durationMs=nullable(INTEGER), nodeId=nullable(STRING), allocationId=nullable(STRING),
    hostShare=nullable(obj(vcpus=INTEGER, memoryGiB=INTEGER)), binding=nullable(OBJECT),
    placementAttempts=INTEGER, failureReason=nullable(STRING), seriesId=nullable(STRING),
    idleSince=nullable(TIME),
    gang=nullable(obj(id=STRING, nodes=INTEGER, index=INTEGER, state=STRING,
                      members=array(obj(id=STRING, state=STRING,
                                        nodeId=nullable(STRING))))),
    createdAt=TIME, placedAt=nullable(TIME), endedAt=nullable(TIME))
SERIES = obj(
    id=STRING, tenantId=STRING, poolId=STRING,
    devices=array(obj(**{"class": STRING, "count": INTEGER, "topology": STRING})),
    product=nullable(STRING), selector=nullable(STRING), every=STRING, timezone=STRING,
    **{"from": DATE}, until=DATE, horizonDays=INTEGER, bookedThrough=nullable(DATE),
    occurrences=obj(**dict.fromkeys(ReservationState.values, INTEGER)),
    refusals=array(obj(start=TIME, reason=STRING)), createdAt=TIME, endedAt=nullable(TIME))
SANDBOX = obj(
    id=STRING, tenantId=STRING, poolId=STRING, nodeId=nullable(STRING), name=STRING,
    vcpus=INTEGER, memoryGiB=INTEGER, state=STRING, imageId=nullable(STRING),
    forwards=array(obj(hostPort=INTEGER, guestPort=INTEGER)),
    accelerator=nullable(STRING), failureReason=nullable(STRING),
    exitStatus=nullable(INTEGER), createdAt=TIME, startedAt=nullable(TIME),
    releasedAt=nullable(TIME), endedAt=nullable(TIME), network=STRING, desired=STRING,
    expiresAt=nullable(TIME))
USAGE = obj(id=STRING, subject=STRING, meter=STRING, quantity=STRING, windowStart=TIME,
            windowEnd=TIME)


def present_offering(offering: Offering) -> dict[str, Any]:
    return {"id": offering.id, "poolId": offering.pool_id, "tenantId": offering.tenant_id,
            "tenant": offering.tenant.slug,
            "quota": {q.resource: {"limit": q.limit, "used": q.used}
                      for q in offering.quotas.all()},
            "limits": offering.limits, "share": offering.share,
            "priorityClasses": offering.priority_classes, "createdAt": offering.created_at,
            "updatedAt": offering.updated_at}


def present_reservation(rsv: Reservation) -> dict[str, Any]:
    allocation = next((a for a in rsv.allocations.all() if a.ended_at is None), None)
    return {
        "id": rsv.id, "tenantId": rsv.tenant_id, "poolId": rsv.pool_id, "state": rsv.state,
        "devices": [{"class": rsv.device_class, "count": rsv.count,
                     "topology": rsv.topology, "profile": rsv.profile or None}],
        "model": rsv.model or None, "product": rsv.product or None,
        "selector": rsv.selector or None, "kubernetes": rsv.kubernetes,
        "slurm": rsv.slurm_account or None,
        "priorityClass": rsv.priority_class, "borrowed": rsv.borrowed, "planned": rsv.planned,
        "preemptAt": rsv.preempt_at, "bindingKind": rsv.binding_kind,
        "start": rsv.starts_at, "end": rsv.ends_at, "durationMs": rsv.duration_ms,
        "nodeId": allocation.node_id if allocation else None,
        "allocationId": allocation.id if allocation else None,
        "hostShare": ({"vcpus": allocation.vcpus, "memoryGiB": allocation.memory_gib}
                      if allocation else None),
        "binding": rsv.binding,
        "placementAttempts": rsv.placement_attempts,
        "failureReason": rsv.failure_reason or None, "seriesId": rsv.series_id,
        "idleSince": rsv.idle_since, "gang": present_gang(rsv) if rsv.gang_id else None,
        "createdAt": rsv.created_at, "placedAt": rsv.placed_at, "endedAt": rsv.ended_at,
    }


PROGRESS = [ReservationState.PENDING, ReservationState.PLACED, ReservationState.BINDING,
            ReservationState.ACTIVE]


def present_gang(rsv: Reservation) -> dict[str, Any]:
    """A gang member's gang: its members, and the gang's state: the least advanced of its
    live members' (active only once every member is), or how the gang ended."""
    members = list(Reservation.objects.filter(gang_id=rsv.gang_id).order_by("gang_index")
                   .values_list("id", "state", "allocations__node_id",
                                "allocations__ended_at"))
    seen: dict[str, dict[str, Any]] = {}
    for member_id, state, node_id, ended in members:
        entry = seen.setdefault(member_id, {"id": member_id, "state": state, "nodeId": None})
        if node_id and ended is None:
            entry["nodeId"] = node_id
    states = [m["state"] for m in seen.values()]
    live = [s for s in states if s in PROGRESS]
    state = min(live, key=PROGRESS.index) if live else states[rsv.gang_index]
    return {"id": rsv.gang_id, "nodes": len(seen), "index": rsv.gang_index, "state": state,
            "members": list(seen.values())}


def present_series(series: ReservationSeries) -> dict[str, Any]:
    counts = dict.fromkeys(ReservationState.values, 0)
    for state, count in (series.occurrences.values_list("state").annotate(n=Count("id"))
                         .order_by()):
        counts[state] = count
    return {"id": series.id, "tenantId": series.tenant_id, "poolId": series.pool_id,
            "devices": [{"class": "gpu", "count": series.count,
                         "topology": series.topology}],
            "product": series.product or None, "selector": series.selector or None,
            "every": series.every, "timezone": series.time_zone, "from": series.first_day,
            "until": series.until, "horizonDays": series.horizon_days,
            "bookedThrough": series.booked_through, "occurrences": counts,
            "refusals": series.refusals, "createdAt": series.created_at,
            "endedAt": series.ended_at}


def present_sandbox(sandbox: Sandbox) -> dict[str, Any]:
    return {"id": sandbox.id, "tenantId": sandbox.tenant_id, "poolId": sandbox.pool_id,
            "nodeId": sandbox.node_id, "name": sandbox.name, "vcpus": sandbox.vcpus,
            "memoryGiB": sandbox.memory_gib, "state": sandbox.state,
            "imageId": sandbox.image_id, "forwards": sandbox.forwards,
            "accelerator": sandbox.accelerator or None,
            "failureReason": sandbox.failure_reason or None, "exitStatus": sandbox.exit_status,
            "createdAt": sandbox.created_at, "startedAt": sandbox.started_at,
            "releasedAt": sandbox.released_at, "endedAt": sandbox.ended_at,
            "network": sandbox.network, "desired": sandbox.desired,
            "expiresAt": sandbox.expires_at}


def present_usage(record: UsageRecord) -> dict[str, Any]:
    return {"id": record.id, "subject": record.subject, "meter": record.meter,
            "quantity": str(record.quantity), "windowStart": record.window_start,
            "windowEnd": record.window_end}
