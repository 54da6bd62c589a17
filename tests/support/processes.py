"""What tests need to run real server processes against the test database."""

from __future__ import annotations

import socket
from urllib.parse import quote

from django.conf import settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    """The test database as a URL another process can use."""
    db = settings.DATABASES["default"]
    user = f"{db['USER']}:{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else db["USER"]
    if db["HOST"].startswith("/"):
        return f"postgresql://{user}@/{db['NAME']}?host={db['HOST']}"
    return f"postgresql://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
