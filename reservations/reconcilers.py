"""The ledger's level-triggered reconcilers on the work queue.

`sweep()` turns timers into work items: reservations whose window starts or ends (or whose
end is within notice), bindings
past their timeout, pools with pending requests, series whose horizon moved, nodes whose
free time bookings marked stale. Each item's handler reads the current state and takes one
step, so running it twice, or after a lost message, is harmless.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.db.models import Q

from compute.core.db import database_now
from compute.platform.queue.work import enqueue, handler
from fleet.models import Device, Health
from fleet.work import DEVICE, TELEMETRY
from reservations.gaps import gaps_mend, stale_nodes
from reservations.models import Reservation, ReservationState, UsageDelivery
from reservations.selectors import expired_sandboxes
from reservations.services.backfill import plan_starts, start_planned_earlier
from reservations.services.binding import (
    TIMEOUT_REASON,
    binding_fail,
    binding_overdue,
    reservation_bind,
)
from reservations.services.device_failure import (
    reservation_flag_device,
    reservation_replace_off_device,
)
from reservations.services.idle import reservation_idle_check, watched_on
from reservations.services.metering import hour_floor
from reservations.services.notices import (
    DEFAULT_JSON,
    ENDING_DUE,
    notice_due,
    reservation_ending_notice,
)
from reservations.services.pending import pending_place
from reservations.services.preemption import preempt_for_queue, reservation_preempted_release
from reservations.services.release import reservation_expire
from reservations.services.sandboxes import sandbox_expire
from reservations.services.series import series_due, series_extend
from reservations.services.usage_close import (
    reservations_to_close,
    sandboxes_to_close,
    usage_close,
)
from reservations.services.usage_sinks import usage_sink_pass
from reservations.states import HOLDING
from reservations.work import (
    GAPS,
    POOL,
    RESERVATION,
    SANDBOX,
    SERIES,
    USAGE_CLOSE,
    USAGE_SINK,
    pool_replan,
)


@handler(RESERVATION)
def reconcile_reservation(reservation_id: str) -> None:
    """One step for one reservation: end it (its window over, or preempted), fail its late
    binding, or bind it."""
    rsv = Reservation.objects.filter(pk=reservation_id).first()
    if rsv is None or rsv.during is None:
        return
    now = database_now()
    if rsv.state in HOLDING and rsv.preempt_at is not None and rsv.preempt_at <= now:
        reservation_preempted_release(reservation_id=rsv.id)
    elif rsv.state in HOLDING and rsv.during.upper <= now:
        reservation_expire(reservation_id=rsv.id)
    elif notice_due(rsv) is not None:
        reservation_ending_notice(reservation_id=rsv.id)
    elif rsv.state == ReservationState.BINDING and \
            Reservation.objects.filter(binding_overdue(now), pk=rsv.id).exists():
        binding_fail(reservation_id=rsv.id, reason=TIMEOUT_REASON)
    elif rsv.state == ReservationState.PLACED and rsv.during.lower <= now:
        # What ended on the node is released first, so that its spec never holds the GPUs
        # of a reservation whose window ended and of the one that starts after it (the
        # node refuses such a spec's new hold as an overlap).
        for ended in _ended_on_node(rsv, now):
            reservation_expire(reservation_id=ended)
        reservation_bind(reservation_id=rsv.id)


def _ended_on_node(rsv: Reservation, now: datetime) -> list[str]:
    node = rsv.allocations.filter(ended_at__isnull=True).values("node_id")
    return list(Reservation.objects.filter(
        state__in=HOLDING, during__endswith__lte=now, allocations__ended_at__isnull=True,
        allocations__node_id__in=node).values_list("id", flat=True))


@handler(DEVICE)
def reconcile_device(device_id: str) -> None:
    """A GPU turned unhealthy: apply its pool's `onDeviceFailure` to what books it. A GPU
    that healed is capacity again: the pool's pending reservations are offered it."""
    device = Device.objects.select_related("node__pool").filter(pk=device_id).first()
    if device is None:
        return
    if device.health == Health.HEALTHY:
        pool_replan(device.node.pool_id)
        return
    replace = device.node.pool.policy.get("onDeviceFailure") == "replace-future"
    now = database_now()
    holders = (Reservation.objects.filter(allocations__ended_at__isnull=True,
                                          allocations__bookings__device_id=device_id,
                                          state__in=HOLDING)
               .distinct().values_list("id", "state", "during"))
    for rsv_id, state, during in holders:
        if state == ReservationState.PLACED and during is not None and during.lower > now:
            if replace:
                reservation_replace_off_device(reservation_id=rsv_id, device=device)
        else:
            reservation_flag_device(reservation_id=rsv_id, device=device)


@handler(TELEMETRY)
def reconcile_telemetry(node_id: str) -> None:
    """A node sent GPU readings: judge its holds whose offering reclaims idle GPUs."""
    for reservation_id in watched_on(node_id):
        reservation_idle_check(reservation_id=reservation_id)


@handler(POOL)
def reconcile_pool(pool_id: str) -> None:
    """Offer a pool's free capacity to its reservations in the queue's order: planned ones
    that now fit start now, then (where the pool plans starts) each pending one is placed
    now or at its earliest window, then the rest are placed where they fit now; then the
    first still waiting that may preempt, does."""
    start_planned_earlier(pool_id)
    plan_starts(pool_id)
    pending_place(pool_id=pool_id)
    preempt_for_queue(pool_id)


@handler(SERIES)
def reconcile_series(series_id: str) -> None:
    """Book the occurrences that came inside a series' horizon."""
    series_extend(series_id=series_id)


@handler(GAPS)
def reconcile_gaps(node_id: str) -> None:
    """Recompute the node's free time where its bookings changed (derived rows: no event,
    no audit row)."""
    gaps_mend([node_id])


def sweep(limit: int = 500) -> int:
    """Enqueue what timers made due; cheap enough to run every half second."""
    now = database_now()
    due = (Reservation.objects.filter(
        Q(state=ReservationState.PLACED, during__startswith__lte=now)
        | Q(state__in=HOLDING, during__endswith__lte=now)
        | Q(state__in=HOLDING, preempt_at__lte=now)
        | binding_overdue(now))
        .values_list("id", flat=True)[:limit])
    count = 0
    for rsv_id in due:
        enqueue(RESERVATION, rsv_id)
        count += 1
    waiting = (Q(state=ReservationState.PENDING)
               | Q(state=ReservationState.PLACED, planned=True, during__startswith__gt=now))
    for pool_id in Reservation.objects.filter(waiting).values_list("pool_id",
                                                                   flat=True).distinct():
        enqueue(POOL, pool_id)
        count += 1
    for series_id in series_due(now)[:limit]:
        enqueue(SERIES, series_id)
        count += 1
    for node_id in stale_nodes(limit):
        enqueue(GAPS, node_id)
        count += 1
    with connection.cursor() as cursor:
        cursor.execute(ENDING_DUE, {"now": now, "default": DEFAULT_JSON, "limit": limit})
        for (rsv_id,) in cursor.fetchall():
            enqueue(RESERVATION, rsv_id)
            count += 1
    now_hour = hour_floor(now)
    closing = [*reservations_to_close(now_hour).values_list("id", flat=True)[:limit],
               *sandboxes_to_close(now_hour).values_list("id", flat=True)[:limit]]
    for subject_id in closing:
        enqueue(USAGE_CLOSE, subject_id)
        count += 1
    for sink in (UsageDelivery.objects.filter(delivered_at__isnull=True,
                                              next_attempt_at__lte=now)
                 .values_list("sink", flat=True).distinct()):
        enqueue(USAGE_SINK, sink)
        count += 1
    for sandbox_id in expired_sandboxes(limit):
        enqueue(SANDBOX, sandbox_id)
        count += 1
    return count


@handler(SANDBOX)
def reconcile_sandbox(sandbox_id: str) -> None:
    """Release a sandbox whose time limit passed."""
    sandbox_expire(sandbox_id=sandbox_id)


@handler(USAGE_CLOSE)
def reconcile_usage_close(subject_id: str) -> None:
    """Meter a running reservation or sandbox up to the last full hour."""
    usage_close(subject_id=subject_id)


@handler(USAGE_SINK)
def reconcile_usage_sink(sink: str) -> None:
    """Deliver the closed usage records due to one metering sink."""
    usage_sink_pass(sink)
