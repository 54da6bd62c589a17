"""Closing usage on the hour: a reservation or sandbox that runs is metered up to the last
full hour, so that usage is billed while it runs, not only when it ends."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from audit.services import audit_exempt, audited
from compute.core.db import database_now
from reservations.models import Reservation, Sandbox, SandboxState
from reservations.services.metering import hour_floor, reservation_meter
from reservations.services.sandboxes import sandbox_meter
from reservations.states import HOLDING

RUNNING = (SandboxState.RUNNING, SandboxState.PAUSED)


def reservations_to_close(now_hour) -> QuerySet[Reservation]:  # type: ignore[no-untyped-def]
    """Started reservations metered to before `now_hour`."""
    return Reservation.objects.filter(
        Q(metered_until__lt=now_hour) | Q(metered_until__isnull=True),
        state__in=HOLDING, during__startswith__lt=now_hour)


def sandboxes_to_close(now_hour) -> QuerySet[Sandbox]:  # type: ignore[no-untyped-def]
    return Sandbox.objects.filter(
        Q(metered_from__lt=now_hour)
        | Q(metered_from__isnull=True, started_at__lt=now_hour), state__in=RUNNING)


@audited
def usage_close(*, subject_id: str) -> None:
    """Meter a running reservation (rsv_…) or sandbox (sbx_…) up to the last full hour."""
    now_hour = hour_floor(database_now())
    if subject_id.startswith("rsv_"):
        rsv = (reservations_to_close(now_hour).select_for_update(no_key=True)
               .select_related("pool").filter(pk=subject_id).first())
        if rsv is not None:
            reservation_meter(rsv, now_hour)
    else:
        sandbox = (sandboxes_to_close(now_hour).select_for_update(no_key=True)
                   .select_related("pool").filter(pk=subject_id).first())
        if sandbox is not None:
            sandbox_meter(sandbox, now_hour)
    audit_exempt("usage closed on the hour: bookkeeping nobody decided")
