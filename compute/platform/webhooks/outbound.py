"""Where a webhook may be sent, and sending one as the Standard Webhooks convention says.

BETTER_COMPUTE_WEBHOOK_ALLOW lists what the operator allows: `public` (any globally routable
address), CIDRs (`10.20.0.0/16`, `127.0.0.1/32`) and host names (`hooks.example.com`,
`*.example.com`). Every address a URL's host resolves to must be allowed, so a loopback,
private or link-local address is refused unless a CIDR or the host's name allows it. It is
checked when a subscription is made and again before each attempt (a name may move).
Redirects are not followed: a 3xx is a failed attempt.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from fnmatch import fnmatch
from urllib.parse import urlsplit

from django.conf import settings

SECRET_PREFIX = "whsec_"  # noqa: S105 (the format's prefix, not a secret)


class Refused(ValueError):
    """A URL the allowlist does not allow, and why."""


def allowlist() -> list[str]:
    return [entry.strip().lower() for entry in settings.BC_WEBHOOK_ALLOW.split(",")
            if entry.strip()]


def check_url(url: str) -> None:
    """Raise Refused unless `url` is http(s) to a host every address of which is allowed."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:
        raise Refused(f"is not a URL this can send to ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused("must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise Refused("must not carry a user name or password")
    host, entries = parts.hostname.lower(), allowlist()
    if any(not _is_network(e) and e != "public" and fnmatch(host, e) for e in entries):
        return  # the operator named this host
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, port,
                                                                type=socket.SOCK_STREAM)}
    except (OSError, ValueError) as error:
        raise Refused(f"its host {host} does not resolve ({error})") from None
    networks = [ipaddress.ip_network(e, strict=False) for e in entries if _is_network(e)]
    for text in sorted(found):
        address = ipaddress.ip_address(text.split("%")[0])
        if any(address in network for network in networks):
            continue
        if "public" in entries and address.is_global:
            continue
        kind = ("a loopback" if address.is_loopback else "a private" if address.is_private
                else "a link-local" if address.is_link_local else "an")
        raise Refused(f"its host resolves to {address}, {kind} address the operator does not "
                      "allow (BETTER_COMPUTE_WEBHOOK_ALLOW)")


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` under the secret's bytes."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None
    error: str


def send(url: str, secret: str, message_id: str, body: bytes) -> Outcome:
    """POST one webhook message, signed; ok only on a 2xx within the timeout."""
    timestamp = int(time.time())
    return post(url, body, {
        "content-type": "application/json", "user-agent": "better-compute-webhooks",
        "webhook-id": message_id, "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, message_id, timestamp, body)})


def post(url: str, body: bytes, headers: dict[str, str]) -> Outcome:
    """POST `body` to an allowed URL (checked again now), without following a redirect;
    ok only on a 2xx within BETTER_COMPUTE_WEBHOOK_TIMEOUT_SECONDS."""
    import httpx

    try:
        check_url(url)
    except Refused as refused:
        return Outcome(False, None, f"refused: {refused}")
    try:
        with httpx.Client(timeout=settings.BC_WEBHOOK_TIMEOUT_SECONDS,
                          follow_redirects=False) as client:
            answer = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as error:
        return Outcome(False, None, f"{type(error).__name__}: {error}"[:300])
    if 200 <= answer.status_code < 300:
        return Outcome(True, answer.status_code, "")
    return Outcome(False, answer.status_code, f"answered {answer.status_code}")


def retry_wait(attempts: int, longest: timedelta = timedelta(hours=1)) -> timedelta:
    """How long after its `attempts`-th failed attempt a delivery is tried again: 1, 2, 4 …
    seconds, at most `longest`."""
    return min(timedelta(seconds=2 ** min(max(attempts - 1, 0), 20)), longest)
