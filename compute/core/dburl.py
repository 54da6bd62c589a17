"""Turn a `postgresql://` URL into Django's DATABASES entry, as libpq reads it: several hosts
(`postgresql://u@a:5432,b:5432/db?target_session_attrs=read-write`), a socket folder
(`?host=/run/postgresql`), and every other libpq parameter (`sslmode`, `sslrootcert`,
`connect_timeout`, ...) passed through to the connection."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from compute.core.config import flag

# Whether the hot paths' statements are prepared on their connection
# (`BETTER_COMPUTE_DB_PREPARE=0` for a pooler that cannot follow prepared statements).
PREPARING = flag("BETTER_COMPUTE_DB_PREPARE")


def _hosts_and_ports(hostlist: str) -> tuple[str, str]:
    """`a:5432,[::1]:5433,b` -> ("a,::1,b", "5432,5433,") as libpq's comma lists."""
    hosts, ports = [], []
    for item in filter(None, hostlist.split(",")):
        if item.startswith("["):  # an IPv6 address
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if port and not port.isdigit():
            raise ValueError(f"DATABASE_URL: port {port!r} of host {host!r} is not a number")
        hosts.append(unquote(host))
        ports.append(port)
    return ",".join(hosts), ",".join(ports) if any(ports) else ""


def parse_database_url(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    host, port = _hosts_and_ports(hostlist)
    options: dict[str, str] = dict(parse_qsl(parts.query))
    host = options.pop("host", "") or host
    port = options.pop("port", "") or port
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(options.pop("dbname", "") or parts.path.lstrip("/")) or "postgres",
        "USER": unquote(options.pop("user", "") or user or "postgres"),
        "PASSWORD": unquote(options.pop("password", "") or password),
        "HOST": host,
        "PORT": port,
        "OPTIONS": options,
        "CONN_MAX_AGE": 0,
    }


def networked(database: dict[str, Any]) -> bool:
    """Whether the database is reached over the network (so other hosts may share it), not
    through a local socket folder."""
    return any(host and not host.startswith("/") for host in database["HOST"].split(","))


def one_plan_per_statement(database: dict[str, Any]) -> None:
    """Have every connection keep one plan per prepared statement (after any `options` of
    the URL). By default Postgres plans a statement afresh at every call when its generic
    plan looks dearer than a fresh one, which cost placement more than running it (about
    1.1 ms of planning against 0.4 ms of work per booking)."""
    options = database["OPTIONS"]
    options["options"] = " ".join(
        filter(None, [options.get("options", ""), "-c plan_cache_mode=force_generic_plan"]))
