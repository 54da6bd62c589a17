"""Install (or update) the periodic jobs in django-q2's scheduler."""

from django.core.management.base import BaseCommand

from compute.platform.schedules import install_schedules


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: object, **options: object) -> None:
        self.stdout.write(f"{install_schedules()} schedule(s) installed")
