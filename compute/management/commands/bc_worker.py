"""A worker of the work queue: claims shard leases, sweeps timers, runs due items.

Run several (on one or many hosts): each takes a fair share of the 256 shards; if one dies,
its shards are taken over when its leases expire.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import time
from datetime import timedelta

from django.apps import apps
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from compute.queue.work import Worker

SWEEPERS = "sweep"  # an app's `<app>.reconcilers.sweep()` enqueues what timers made due


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true")
        parser.add_argument("--interval", type=float, default=0.5)
        parser.add_argument("--lease", type=float, default=10.0, help="lease seconds")
        parser.add_argument("--import", dest="imports", action="append", default=[],
                            help="extra handler modules to load (tests)")

    def handle(self, *args: object, loop: bool, interval: float, lease: float,
               imports: list[str], **options: object) -> None:
        for module in imports:
            importlib.import_module(module)
        sweepers = []
        for config in apps.get_app_configs():
            try:
                module = importlib.import_module(f"{config.name}.reconcilers")
            except ModuleNotFoundError:
                continue
            if hasattr(module, SWEEPERS):
                sweepers.append(getattr(module, SWEEPERS))
        worker = Worker(f"{socket.gethostname()}:{os.getpid()}",
                        lease=timedelta(seconds=lease))
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
        try:
            while True:
                close_old_connections()
                for sweep in sweepers:
                    sweep()
                ran = worker.run_once()
                if not loop or stop["now"]:
                    return
                if not ran:
                    time.sleep(interval)
        finally:
            worker.release()
