"""Write the gateway's TLS credentials (key, certificate from the serving CA, CA) to a folder.

The gateway reads them at start; it never holds the CA key or any signing key.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandParser

from fleet.pki import issue_gateway_certificate, pki


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", type=Path, required=True)
        parser.add_argument("--host", action="append", default=[],
                            help="Host name or address the gateway serves (repeatable).")

    def handle(self, *args: object, out: Path, host: list[str], **options: object) -> None:
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        key, cert = issue_gateway_certificate(host or ["localhost", "127.0.0.1"])
        for name, text in (("key.pem", key), ("cert.pem", cert), ("ca.pem", pki().ca_pem)):
            fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        self.stdout.write(f"gateway credentials written to {out}")
