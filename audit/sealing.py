"""Sealed secrets: keys kept in Postgres, encrypted with a key-encryption key (KEK).

The KEK comes from `BC_KEK` (32 bytes, base64), or the file named by `BC_KEK_FILE`, or a
0600 file made on first use under the state root. Back up the KEK apart from the database:
a database dump alone reveals no key, and without the KEK the keys cannot be opened.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from compute.core.db import advisory_xact_lock
from compute.core.pg import state_root

KEK_BYTES = 32


class SealedSecret(models.Model):
    """One named secret, AES-256-GCM encrypted under the KEK with its name as associated
    data (so a ciphertext cannot be swapped under another name)."""

    name = models.CharField(max_length=64, primary_key=True)
    nonce = models.BinaryField()
    ciphertext = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class KekUnavailable(RuntimeError):
    pass


def _kek_file() -> Path:
    explicit = settings.BC_KEK_FILE
    if explicit:
        return Path(explicit)
    return state_root() / "secrets" / "kek"


def kek() -> bytes:
    if settings.BC_WITHOUT_KEK:
        raise KekUnavailable("this process runs without the key-encryption key")
    value = settings.BC_KEK
    if value:
        raw = base64.b64decode(value)
    else:
        path = _kek_file()
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(base64.b64encode(secrets.token_bytes(KEK_BYTES)).decode())
            except FileExistsError:
                pass
        raw = base64.b64decode(path.read_text().strip())
    if len(raw) != KEK_BYTES:
        raise KekUnavailable(f"the key-encryption key must be {KEK_BYTES} bytes")
    return raw


def seal(name: str, plaintext: bytes) -> SealedSecret:
    nonce = secrets.token_bytes(12)
    ciphertext = AESGCM(kek()).encrypt(nonce, plaintext, name.encode())
    return SealedSecret.objects.create(name=name, nonce=nonce, ciphertext=ciphertext)


def unseal(row: SealedSecret) -> bytes:
    return AESGCM(kek()).decrypt(bytes(row.nonce), bytes(row.ciphertext), row.name.encode())


def sealed_secret(name: str, make: Callable[[], bytes]) -> bytes:
    """The secret called `name`, made by `make()` and sealed on first use (race-safe)."""
    row = SealedSecret.objects.filter(pk=name).first()
    if row is None:
        with transaction.atomic():
            advisory_xact_lock(f"sealed:{name}")
            row = SealedSecret.objects.filter(pk=name).first() or seal(name, make())
    return unseal(row)
