"""Turn a `postgresql://` URL into Django's DATABASES entry."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

_OPTION_KEYS = {"sslmode", "sslrootcert", "sslcert", "sslkey", "application_name", "options"}


def parse_database_url(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    query = dict(parse_qsl(parts.query))
    host = query.pop("host", None) or unquote(parts.hostname or "")
    options = {k: v for k, v in query.items() if k in _OPTION_KEYS}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        "CONN_MAX_AGE": 0,
    }
