"""Reads of the ledger, always scoped to the acting tenant."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from compute.core.db import database_now
from compute.platform.guards import one_visible
from compute.platform.tenancy.models import Tenant
from reservations.models import (
    MaintenanceWindow,
    Offering,
    Reservation,
    ReservationSeries,
    Sandbox,
    UsageRecord,
)
from reservations.models.sandboxes import LIVE


def offering_list(*, tenant: Tenant) -> QuerySet[Offering]:
    """Offerings the tenant made (of its pools) or received."""
    return Offering.objects.filter(Q(tenant=tenant) | Q(pool__tenant=tenant)).prefetch_related(
        "quotas").select_related("pool", "tenant")


def reservation_list(*, tenant: Tenant, pool_id: str | None = None,
                     state: str | None = None) -> QuerySet[Reservation]:
    queryset = Reservation.objects.filter(tenant=tenant).select_related("pool")
    if pool_id:
        queryset = queryset.filter(pool_id=pool_id)
    if state:
        queryset = queryset.filter(state=state)
    return queryset


def access_reservation_by_id(*, tenant: Tenant, reservation_id: str,
                             lock: bool = False) -> Reservation:
    return one_visible(reservation_list(tenant=tenant), reservation_id, noun="reservation",
                       field="reservationId", lock=lock)


def series_list(*, tenant: Tenant) -> QuerySet[ReservationSeries]:
    return ReservationSeries.objects.filter(tenant=tenant).select_related("tenant", "pool")


def access_series_by_id(*, tenant: Tenant, series_id: str,
                        lock: bool = False) -> ReservationSeries:
    return one_visible(series_list(tenant=tenant), series_id, noun="series", field="seriesId",
                       lock=lock)


def sandbox_list(*, tenant: Tenant, pool_id: str | None = None) -> QuerySet[Sandbox]:
    queryset = Sandbox.objects.filter(tenant=tenant)
    return queryset.filter(pool_id=pool_id) if pool_id else queryset


def access_sandbox_by_id(*, tenant: Tenant, sandbox_id: str, lock: bool = False) -> Sandbox:
    return one_visible(sandbox_list(tenant=tenant), sandbox_id, noun="sandbox",
                       field="sandboxId", lock=lock)


def expired_sandboxes(limit: int = 500) -> list[str]:
    """Live sandboxes whose time limit has passed and that are not released yet."""
    return list(Sandbox.objects.filter(state__in=LIVE, released_at__isnull=True,
                                       expires_at__lte=database_now())
                .values_list("id", flat=True)[:limit])


def usage_list(*, tenant: Tenant, meter: str | None = None,
               subject: str | None = None) -> QuerySet[UsageRecord]:
    queryset = UsageRecord.objects.filter(tenant=tenant)
    if meter:
        queryset = queryset.filter(meter=meter)
    return queryset.filter(subject=subject) if subject else queryset


def maintenance_list(*, tenant: Tenant, node_id: str | None = None
                     ) -> QuerySet[MaintenanceWindow]:
    """Maintenance windows of the nodes in the tenant's own pools."""
    queryset = MaintenanceWindow.objects.filter(node__pool__tenant=tenant)
    return queryset.filter(node_id=node_id) if node_id else queryset


def access_maintenance_by_id(*, tenant: Tenant, window_id: str,
                             lock: bool = False) -> MaintenanceWindow:
    return one_visible(maintenance_list(tenant=tenant), window_id, noun="maintenance window",
                       field="windowId", lock=lock)
