"""Reads of sites and pools, always scoped to the acting tenant."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from compute.guards import one_visible
from compute.tenancy.models import Tenant
from fleet.models import JoinToken, Node, Pool, Site


def site_list(*, tenant: Tenant) -> QuerySet[Site]:
    return Site.objects.filter(tenant=tenant)


def access_site_by_id(*, tenant: Tenant, site_id: str) -> Site:
    return one_visible(site_list(tenant=tenant), site_id, noun="site", field="siteId")


def pool_list(*, tenant: Tenant) -> QuerySet[Pool]:
    """Pools the tenant owns and pools offered to it."""
    return Pool.objects.filter(Q(tenant=tenant) | Q(offerings__tenant=tenant)).distinct()


def access_pool_by_id(*, tenant: Tenant, pool_id: str, owned: bool = False,
                      lock: bool = False) -> Pool:
    """The pool if the tenant owns it (or, unless `owned`, was offered it); else NotFound."""
    queryset = Pool.objects.filter(tenant=tenant) if owned else pool_list(tenant=tenant)
    pool = one_visible(queryset, pool_id, noun="pool", field="poolId")
    if lock:
        pool = Pool.objects.select_for_update().get(pk=pool.pk)
    return pool


def node_list(*, tenant: Tenant, pool_id: str | None = None) -> QuerySet[Node]:
    """Nodes of pools the tenant owns."""
    queryset = Node.objects.filter(pool__tenant=tenant).select_related("pool")
    if pool_id:
        queryset = queryset.filter(pool_id=pool_id)
    return queryset


def access_node_by_id(*, tenant: Tenant, node_id: str, lock: bool = False) -> Node:
    return one_visible(node_list(tenant=tenant), node_id, noun="node", field="nodeId",
                       lock=lock)


def join_token_list(*, tenant: Tenant) -> QuerySet[JoinToken]:
    return JoinToken.objects.filter(pool__tenant=tenant)


def access_join_token_by_id(*, tenant: Tenant, token_id: str, lock: bool = False) -> JoinToken:
    return one_visible(join_token_list(tenant=tenant), token_id, noun="join token",
                       field="tokenId", lock=lock)
