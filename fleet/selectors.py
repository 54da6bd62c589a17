"""Reads of sites and pools, always scoped to the acting tenant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet

from compute.core.db import row_by_key
from compute.core.errors import NotFound
from compute.core.sqltext import tables
from compute.platform.guards import one_visible
from compute.platform.tenancy.models import Tenant
from fleet.models import Image, JoinToken, Node, NodeSpec, Pool, ProvisionState, Site


def site_list(*, tenant: Tenant) -> QuerySet[Site]:
    return Site.objects.filter(tenant=tenant)


def access_site_by_id(*, tenant: Tenant, site_id: str) -> Site:
    return one_visible(site_list(tenant=tenant), site_id, noun="site", field="siteId")


def pool_list(*, tenant: Tenant) -> QuerySet[Pool]:
    """Pools the tenant owns and pools offered to it (an EXISTS, not a join: no DISTINCT
    over every column)."""
    return Pool.objects.filter(Q(tenant=tenant) | Exists(_offered(tenant)))


def _offered(tenant: Tenant) -> QuerySet[Any]:
    """The tenant's offerings of the outer query's pool."""
    offering = Pool._meta.get_field("offerings").related_model
    return offering._default_manager.filter(pool=OuterRef("pk"), tenant=tenant)


def access_pool_by_id(*, tenant: Tenant, pool_id: str, owned: bool = False,
                      lock: bool = False) -> Pool:
    """The pool if the tenant owns it (or, unless `owned`, was offered it); else NotFound.

    Read by key, then checked: the owner's pool costs one plain lookup (the booking path
    asks this on every call), an offered one a second."""
    pool = row_by_key(Pool, pool_id)
    if pool is not None and pool.tenant_id != tenant.id and (
            owned or not pool.offerings.filter(tenant=tenant).exists()):
        pool = None
    if pool is None:
        raise NotFound(f"pool {pool_id} not found", poolId=pool_id)
    if lock:
        pool = Pool.objects.select_for_update(no_key=True).get(pk=pool.pk)
    return pool


def image_list(*, tenant: Tenant, pool_id: str) -> QuerySet[Image]:
    """The catalogue of a pool the tenant owns or was offered."""
    return Image.objects.filter(pool=access_pool_by_id(tenant=tenant, pool_id=pool_id))


def access_image_by_id(*, tenant: Tenant, image_id: str, owned: bool = False) -> Image:
    """An image of a pool the tenant owns (or, unless `owned`, was offered)."""
    pools = Pool.objects.filter(tenant=tenant) if owned else pool_list(tenant=tenant)
    return one_visible(Image.objects.filter(pool__in=pools).select_related("pool"), image_id,
                       noun="image", field="imageId")


def node_list(*, tenant: Tenant, pool_id: str | None = None) -> QuerySet[Node]:
    """Nodes of pools the tenant owns."""
    queryset = Node.objects.filter(pool__tenant=tenant).select_related("pool")
    if pool_id:
        queryset = queryset.filter(pool_id=pool_id)
    return queryset


def node_hostnames(*, tenant: Tenant, ids: list[str]) -> dict[str, str]:
    """The hostnames of the tenant's nodes among `ids` (a node acts in the audit log)."""
    return {node_id: hostname for node_id, hostname in
            node_list(tenant=tenant).filter(pk__in=ids).values_list("id", "hostname")
            if hostname}


def access_node_by_id(*, tenant: Tenant, node_id: str, lock: bool = False) -> Node:
    return one_visible(node_list(tenant=tenant), node_id, noun="node", field="nodeId",
                       lock=lock)


def join_token_list(*, tenant: Tenant) -> QuerySet[JoinToken]:
    return JoinToken.objects.filter(pool__tenant=tenant)


def access_join_token_by_id(*, tenant: Tenant, token_id: str, lock: bool = False) -> JoinToken:
    return one_visible(join_token_list(tenant=tenant), token_id, noun="join token",
                       field="tokenId", lock=lock)


# The gateway's reads: no tenant (the node's certificate is its identity), no IAM.


@dataclass(frozen=True)
class SessionNode:
    node_id: str
    site_id: str
    retired: bool


def node_for_session(*, node_id: str) -> SessionNode | None:
    row = Node.objects.filter(pk=node_id).values_list("site_id", "provision_state").first()
    if row is None:
        return None
    return SessionNode(node_id, row[0], row[1] == ProvisionState.RETIRED)


def latest_spec(*, node_id: str) -> dict[str, Any] | None:
    spec = (NodeSpec.objects.filter(node_id=node_id).only("id", "generation", "signed")
            .order_by("-generation").first())
    return None if spec is None else {"generation": spec.generation, "json": spec.signed}


SpecCursor = tuple[int, int]  # (writing transaction id, row id)


def specs_since(*, after: SpecCursor | None, limit: int = 1000
                ) -> tuple[list[dict[str, Any]], SpecCursor]:
    """NodeSpec rows written after the cursor, in commit-safe order, and the new cursor.

    Rows are ordered by the id of the transaction that wrote them, not by row id: a row id
    is taken at insert, so a lower one can commit after a higher one. Only rows of
    transactions older than every one still in flight are read; any later commit has a
    higher transaction id than all of them, so the cursor never passes a row unseen.
    `after=None` starts from now: a session gets its latest spec when it opens.
    """
    with connection.cursor() as cursor:
        if after is None:
            cursor.execute(tables("SELECT txid, id FROM {NodeSpec} WHERE txid < "
                           "pg_snapshot_xmin(pg_current_snapshot())::text::bigint "
                           "ORDER BY txid DESC, id DESC LIMIT 1", NodeSpec=NodeSpec))
            row = cursor.fetchone()
            return [], (row[0], row[1]) if row else (0, 0)
        cursor.execute(tables("SELECT txid, id, node_id, generation, signed FROM {NodeSpec} "
                       "WHERE txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint "
                       "AND (txid, id) > (%s, %s) ORDER BY txid, id LIMIT %s", NodeSpec=NodeSpec),
                       [after[0], after[1], limit])
        rows = cursor.fetchall()
    if not rows:
        return [], after
    specs = [{"nodeId": node_id, "generation": generation, "json": signed}
             for _, _, node_id, generation, signed in rows]
    return specs, (rows[-1][0], rows[-1][1])
