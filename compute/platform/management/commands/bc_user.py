"""Create a user who signs in to the console with a name and password (and, with --staff,
to the Django admin), holding a role in a tenant. The password is read from stdin (or asked
for on a terminal), never from the command line."""

import getpass
import sys

from django.core.management.base import BaseCommand, CommandError, CommandParser

from compute.core.errors import ComputeError
from compute.platform.tenancy.models import ROOT_TENANT_SLUG, Role
from compute.platform.tenancy.services import user_create


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--tenant", default=ROOT_TENANT_SLUG, help="tenant slug")
        parser.add_argument("--role", default=Role.VIEWER, choices=Role.values)
        parser.add_argument("--staff", action="store_true",
                            help="may also sign in to the Django admin (read-only rows, "
                                 "audited actions)")

    def handle(self, *args: object, username: str, tenant: str, role: str, staff: bool,
               **options: object) -> None:
        password = (getpass.getpass(f"password for {username}: ") if sys.stdin.isatty()
                    else sys.stdin.readline().rstrip("\n"))
        if len(password) < 12:
            raise CommandError("the password must be at least 12 characters")
        try:
            principal = user_create(tenant_slug=tenant, username=username, password=password,
                                    role=role, staff=staff)
        except ComputeError as refused:
            raise CommandError(refused.message) from None
        self.stdout.write(f"user {username} is principal {principal.id} ({role} in {tenant})")
