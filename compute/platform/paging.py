"""Keyset paging by id (ids are ULIDs, so id order is creation order)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet


def page(queryset: QuerySet[Any], *, limit: int = 100, after: str | None = None,
         present: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    if after:
        queryset = queryset.filter(pk__gt=after)
    rows = list(queryset.order_by("pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return {"items": [present(row) for row in rows],
            "nextAfter": rows[-1].pk if more and rows else None}
