"""Public object ids: `<prefix>_<ULID in lowercase Crockford base32>`.

The registry below is the only place prefixes are defined; the models, the envelope, the
gateway, bcd and the CLI all use it. A ULID is 48 bits of milliseconds then 80 random bits,
so ids sort by creation time and cannot be guessed.
"""

from __future__ import annotations

import os
import time

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
ULID_LENGTH = 26

PREFIXES: dict[str, str] = {
    "alloc": "allocation",
    "aud": "audit event",
    "bk": "booking",
    "ckpt": "audit checkpoint",
    "cmd": "node command",
    "dec": "IAM decision",
    "dev": "device",
    "evt": "event",
    "img": "image",
    "jtk": "join token",
    "mnt": "maintenance window",
    "node": "node",
    "off": "offering",
    "pool": "pool",
    "prn": "principal",
    "req": "request",
    "rsv": "reservation",
    "gang": "gang (a multi-node reservation)",
    "ser": "reservation series",
    "sbx": "sandbox",
    "site": "site",
    "tnt": "tenant",
    "tok": "API token",
    "use": "usage record",
    "wdl": "webhook delivery",
    "whk": "webhook subscription",
}


class InvalidId(ValueError):
    """A value is not a well-formed id of the expected kind."""


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def ulid(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    randomness = int.from_bytes(os.urandom(10), "big")
    return _encode((ms << 80) | randomness, ULID_LENGTH)


def new(prefix: str) -> str:
    if prefix not in PREFIXES:
        raise KeyError(f"unknown id prefix {prefix!r}")
    return f"{prefix}_{ulid()}"


def parse(value: object, *, expect: str) -> str:
    """Return `value` if it is a well-formed `<expect>_…` id, else raise InvalidId."""
    if not isinstance(value, str):
        raise InvalidId(f"expected a {PREFIXES[expect]} id ({expect}_…)")
    prefix, sep, body = value.partition("_")
    if not sep or prefix != expect:
        raise InvalidId(f"expected a {PREFIXES[expect]} id ({expect}_…), got {value[:40]!r}")
    if len(body) != ULID_LENGTH or any(c not in ALPHABET for c in body):
        raise InvalidId(f"malformed {PREFIXES[expect]} id {value[:40]!r}")
    return value
