"""Create the root tenant (if missing) and print a new root administrator token."""

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandParser

from compute.platform.tenancy.services import root_bootstrap


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", default="admin", help="name of the admin principal")
        parser.add_argument("--token-file", type=Path,
                            help="write the token to this new 0600 file instead of stdout")

    def handle(self, *args: object, name: str, token_file: Path | None, **options: object) -> None:
        minted = root_bootstrap(admin_name=name)
        if token_file is None:
            self.stdout.write(minted.plaintext)
            return
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(minted.plaintext + "\n")
        self.stderr.write(f"root admin token written to {token_file}")
