"""Image parts on the node: fetched once by URL, verified by sha256, kept by hash.

The cache (`var/cache/bcd/images/<sha256>`) only ever holds files whose hash was checked, so
a cached part is used without fetching again; a part whose bytes do not match its hash is
refused and not kept.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

from bcd.config import Paths
from bcd.contract.vms import ImagePart

FETCH_TIMEOUT = 120.0
MAX_BYTES = 64 << 30


class ImageRefused(RuntimeError):
    """A part that could not be fetched or does not match its hash."""


def cache_dir(paths: Paths) -> Path:
    return paths.root / "var/cache/bcd/images"


def fetch(part: ImagePart, paths: Paths, what: str) -> Path:
    """The verified local file of `part`."""
    target = (cache_dir(paths) / part.sha256).absolute()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    partial = target.with_name(f".{part.sha256}.{os.getpid()}.part")
    digest, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(part.url, timeout=FETCH_TIMEOUT) as source, \
                partial.open("wb") as out:  # noqa: S310 (the spec's URL schemes are checked)
            while chunk := source.read(1 << 20):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise ImageRefused(f"{what} is larger than {MAX_BYTES >> 30} GiB")
                digest.update(chunk)
                out.write(chunk)
    except OSError as error:
        partial.unlink(missing_ok=True)
        reason = getattr(error, "reason", None) or error.strerror or error
        raise ImageRefused(f"{what} could not be fetched from {part.url}: {reason}") from None
    except ImageRefused:
        partial.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != part.sha256:
        partial.unlink(missing_ok=True)
        raise ImageRefused(f"{what} from {part.url} has sha256 {digest.hexdigest()}, "
                           f"not {part.sha256}")
    partial.rename(target)
    return target
