"""A worker of the work queue: claims shard leases, sweeps timers, runs due items.

Run several (on one or many hosts): each takes a fair share of the 256 shards; if one dies,
its shards are taken over when its leases expire.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import InterfaceError, OperationalError, close_old_connections, connections

from compute.core.db import conninfo
from compute.core.metrics import serve_metrics
from compute.platform.queue.work import WAKE_CHANNEL, Worker

logger = logging.getLogger("compute.platform.queue")
SWEEPERS = "sweep"  # an app's `<app>.reconcilers.sweep()` enqueues what timers made due


class PeriodicJobs:
    """The periodic jobs (compute/platform/schedules.py) without the django-q2 cluster, on a
    thread of the worker (so that a long job never holds up the work queue): every `every`
    seconds, django-q2's scheduler turns the schedules that fell due into tasks on its
    Postgres broker (each schedule's row locked, its next run set, committed), and this
    thread takes them off the broker and runs them through django-q2's own worker and
    monitor, which record each result and acknowledge it, as the cluster's processes do.
    (For a deployment without the cluster: `dev`, or one small host.)"""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every

    def start(self) -> None:
        threading.Thread(target=self._forever, name="periodic-jobs", daemon=True).start()

    def _forever(self) -> None:
        while True:
            try:
                self.run_due()
            except Exception:  # the database away, a job's import broken: next time
                logger.exception("the periodic jobs could not run")
            finally:
                connections.close_all()
            time.sleep(self.every)

    def run_due(self) -> None:
        from multiprocessing import Queue, Value

        from django_q.brokers import get_broker
        from django_q.monitor import monitor
        from django_q.scheduler import scheduler
        from django_q.signing import SignedPackage
        from django_q.worker import worker

        broker = get_broker()
        scheduler(broker=broker)
        tasks: Queue[Any] = Queue()
        results: Queue[Any] = Queue()
        while batch := broker.dequeue():
            for ack_id, package in batch:
                task = SignedPackage.loads(package)
                task["ack_id"] = ack_id
                tasks.put(task)
        tasks.put("STOP")
        worker(tasks, results, Value("f", -1))
        results.put("STOP")
        monitor(results, broker)
        for queue in (tasks, results):
            queue.close()
            queue.join_thread()


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true")
        parser.add_argument("--metrics-listen", metavar="HOST:PORT", default=None,
                            help="serve Prometheus metrics (/metrics) here")
        parser.add_argument("--interval", type=float, default=1.0,
                            help="seconds between timer sweeps (window starts and ends, "
                                 "binding timeouts, node liveness)")
        parser.add_argument("--lease", type=float, default=10.0, help="lease seconds")
        parser.add_argument("--import", dest="imports", action="append", default=[],
                            help="extra handler modules to load (tests)")
        parser.add_argument("--periodic", action="store_true",
                            help="also run the periodic jobs' due schedules, in this process "
                                 "(a small deployment without the django-q2 cluster)")

    def handle(self, *args: object, loop: bool, interval: float, lease: float,
               imports: list[str], metrics_listen: str | None = None, periodic: bool = False,
               **options: object) -> None:
        if metrics_listen:
            serve_metrics(metrics_listen)
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
        if periodic:
            PeriodicJobs().start()
        worker = Worker(f"{socket.gethostname()}:{os.getpid()}",
                        lease=timedelta(seconds=lease))
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
        backoff = 0.5
        try:
            while True:
                connected = False
                try:
                    with psycopg.connect(conninfo(), autocommit=True) as listener:
                        connected = True
                        listener.execute(f"LISTEN {WAKE_CHANNEL}")
                        self._loop(worker, sweepers, listener, loop=loop, interval=interval,
                                   lease=lease, stop=stop)
                    return
                except (psycopg.OperationalError, OperationalError, InterfaceError) as error:
                    # The database went away (restart, failover): reconnect, never exit.
                    if not loop or stop["now"]:
                        raise
                    logger.warning("database unavailable (%s); retrying in %.1f s", error,
                                   backoff)
                    connections.close_all()
                    if connected:  # it had been working: a new outage, start over
                        backoff = 0.5
                    time.sleep(backoff)
                    backoff = min(settings.BC_DB_RETRY_MAX_SECONDS, backoff * 2)
        finally:
            with contextlib.suppress(OperationalError, InterfaceError):
                worker.release()

    def _loop(self, worker: Worker, sweepers: list[Callable[[], object]],
              listener: psycopg.Connection[Any], *, loop: bool, interval: float, lease: float,
              stop: dict[str, bool]) -> None:
        """Sweep timers every `interval`, run due items, and between them sleep until a new
        item is queued (NOTIFY at its commit), the next one falls due, or the next sweep:
        an idle worker costs a few queries a second, not a busy loop."""
        next_sweep = 0.0
        while True:
            close_old_connections()
            if time.monotonic() >= next_sweep:
                for sweep in sweepers:
                    sweep()
                next_sweep = time.monotonic() + interval
            ran = worker.run_once()
            if not loop or stop["now"]:
                return
            if ran:
                continue
            due = worker.seconds_to_next_due()
            wait = min(next_sweep - time.monotonic(), lease / 3,
                       due if due is not None else lease)
            for _ in listener.notifies(timeout=max(0.0, wait), stop_after=1):
                pass
