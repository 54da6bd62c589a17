"""Reads of sites and pools, always scoped to the acting tenant."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from compute.errors import NotFound
from compute.tenancy.models import Tenant
from fleet.models import Node, Pool, Site


def site_list(*, tenant: Tenant) -> QuerySet[Site]:
    return Site.objects.filter(tenant=tenant)


def access_site_by_id(*, tenant: Tenant, site_id: str) -> Site:
    site = site_list(tenant=tenant).filter(pk=site_id).first()
    if site is None:
        raise NotFound(f"site {site_id} not found", siteId=site_id)
    return site


def pool_list(*, tenant: Tenant) -> QuerySet[Pool]:
    """Pools the tenant owns and pools offered to it."""
    return Pool.objects.filter(Q(tenant=tenant) | Q(offerings__tenant=tenant)).distinct()


def access_pool_by_id(*, tenant: Tenant, pool_id: str, owned: bool = False,
                      lock: bool = False) -> Pool:
    """The pool if the tenant owns it (or, unless `owned`, was offered it); else NotFound."""
    queryset = Pool.objects.filter(tenant=tenant) if owned else pool_list(tenant=tenant)
    pool = queryset.filter(pk=pool_id).first()
    if pool is None:
        raise NotFound(f"pool {pool_id} not found", poolId=pool_id)
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
    queryset = node_list(tenant=tenant)
    if lock:
        queryset = queryset.select_for_update(of=("self",))
    node = queryset.filter(pk=node_id).first()
    if node is None:
        raise NotFound(f"node {node_id} not found", nodeId=node_id)
    return node
