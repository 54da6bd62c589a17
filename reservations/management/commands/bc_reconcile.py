"""Run the reservation reconciler: once, or every second with --loop."""

from __future__ import annotations

import signal
import time

from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from reservations.reconcilers import reconcile_reservations


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true")
        parser.add_argument("--interval", type=float, default=1.0)

    def handle(self, *args: object, loop: bool, interval: float, **options: object) -> None:
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
        while True:
            close_old_connections()
            result = reconcile_reservations()
            if any(result.values()):
                self.stdout.write(str(result))
            if not loop or stop["now"]:
                return
            time.sleep(interval)
