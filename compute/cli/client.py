"""Configuration from the environment, and the envelope client the CLI calls through."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from compute.core import config

USER_AGENT = "better-compute-cli"


class CliError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 1."""


class ApiError(CliError):
    def __init__(self, code: str, message: str, status: int, details: dict[str, Any]) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.status = status
        self.details = details


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> str:
    """The API URL, ending in /api/compute. Plain http is allowed only for loopback hosts."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"BETTER_COMPUTE_URL must be an http(s) URL, got {url!r}")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise CliError(f"BETTER_COMPUTE_URL uses plain http for {parts.hostname}, which is not a "
                       "loopback address: use https")
    base = url.rstrip("/")
    if not base.endswith("/api/compute"):
        base += "/api/compute"
    return base


@dataclass(frozen=True)
class Config:
    url: str
    token: str
    tenant: str | None

    @classmethod
    def from_env(cls) -> Config:
        url = config.text("BETTER_COMPUTE_URL")
        if not url:
            raise CliError("BETTER_COMPUTE_URL is not set: export the API URL printed by "
                           "`better-compute dev`, e.g. http://127.0.0.1:3000/api/compute")
        token = config.text("BETTER_COMPUTE_TOKEN")
        token_file = config.text("BETTER_COMPUTE_TOKEN_FILE")
        if not token and token_file:
            try:
                with open(token_file) as handle:
                    token = handle.read().strip()
            except OSError as error:
                raise CliError(f"cannot read BETTER_COMPUTE_TOKEN_FILE: {error}") from error
        if not token:
            raise CliError("BETTER_COMPUTE_TOKEN is not set: export a biam_… API token "
                           "(or BETTER_COMPUTE_TOKEN_FILE naming a file that holds one)")
        if not (TOKEN_SHAPE.match(token) or JWT_SHAPE.match(token)):
            raise CliError("BETTER_COMPUTE_TOKEN is malformed: an API token looks like "
                           "biam_tok_<id>.<secret> (the docs' biam_… is a placeholder; "
                           "`better-compute dev` writes a real one to its env file), and "
                           "`better-compute login` keeps a single sign-on token (a JWT)")
        return cls(url=check_url(url), token=token,
                   tenant=config.text("BETTER_COMPUTE_TENANT") or None)


TOKEN_SHAPE = re.compile(r"^biam_[a-z]+_[0-9a-z]{26}\.[A-Za-z0-9_-]{20,200}$")
JWT_SHAPE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")


class Client:
    """The CLI's envelope client: the standard library's HTTP client for calls
    (compute.cli.wire), and httpx only for a stream (`http`, made when first used)."""

    def __init__(self, config: Config, timeout: float = 30.0) -> None:
        from compute.cli.wire import Wire

        self.config = config
        self.timeout = timeout
        self.wire = Wire(config.url, config.token, timeout=timeout, user_agent=USER_AGENT)
        self._http: Any = None

    @property
    def http(self) -> Any:
        """An httpx client with the caller's token, for streams."""
        if self._http is None:
            import httpx

            self._http = httpx.Client(
                timeout=self.timeout, verify=not self.config.url.startswith("http://"),
                headers={"Authorization": f"Bearer {self.config.token}",
                         "User-Agent": USER_AGENT})
        return self._http

    def call(self, method: str, body: dict[str, Any] | None = None,
             tenant: str | None = None) -> Any:
        from compute.core.envelope import ApiError as EnvelopeError
        from compute.core.envelope import ClientError

        if "." not in method.strip("."):
            raise CliError(f"method must look like group.method, got {method!r}")
        payload = {k: v for k, v in (body or {}).items() if v is not None}
        tenant = tenant or self.config.tenant
        if tenant and "tenantId" not in payload:
            payload["tenantId"] = tenant
        try:
            return self.wire.call(method, payload)
        except EnvelopeError as error:
            raise ApiError(error.code, error.message, error.status, error.details) from None
        except ClientError as error:
            raise CliError(str(error)) from None
