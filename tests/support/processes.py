"""What tests need to run real server processes against the test database."""

from __future__ import annotations

import socket
from urllib.parse import quote

from django.conf import settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url(database: str | None = None) -> str:
    """The test database (or another of its server) as a URL another process can use."""
    db = settings.DATABASES["default"]
    name = database or db["NAME"]
    user = f"{db['USER']}:{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else db["USER"]
    if db["HOST"].startswith("/"):
        return f"postgresql://{user}@/{name}?host={db['HOST']}"
    return f"postgresql://{user}@{db['HOST']}:{db['PORT'] or 5432}/{name}"
