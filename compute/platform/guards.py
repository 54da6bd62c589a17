"""The body every `access_<entity>_by_id` guard shares."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, QuerySet

from compute.core.errors import NotFound

M = TypeVar("M", bound=Model)


def one_visible(queryset: QuerySet[M], object_id: str, *, noun: str, field: str,
                lock: bool = False) -> M:
    """The object if `queryset` (already scoped to the caller's tenant) holds it, else
    NotFound, whether it is missing or belongs to someone else: existence never leaks."""
    if lock:
        queryset = queryset.select_for_update(no_key=True, of=("self",))
    found: Any = queryset.filter(pk=object_id).first()
    if found is None:
        raise NotFound(f"{noun} {object_id} not found", **{field: object_id})
    return found
