"""Model field helpers shared by every app."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import models

from bcd.contract import ids


def _new_id(prefix: str) -> str:
    return ids.new(prefix)


def id_field(prefix: str, *, primary_key: bool = True) -> models.CharField[Any, Any]:
    """A public id `<prefix>_<ULID>`: the primary key unless a sequence orders the table."""
    return models.CharField(max_length=32, primary_key=primary_key, unique=not primary_key,
                            default=partial(_new_id, prefix), editable=False)
