from __future__ import annotations

from django.db.models import Q, QuerySet

from compute.tenancy.models import Tenant
from reservations.offerings import Offering


def offering_list(*, tenant: Tenant) -> QuerySet[Offering]:
    """Offerings the tenant made (of its pools) or received."""
    return Offering.objects.filter(Q(tenant=tenant) | Q(pool__tenant=tenant)).prefetch_related(
        "quotas").select_related("pool", "tenant")
