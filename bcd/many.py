"""`bcd sim agents`: many simulated machines in one process.

Each machine is its own agent, as under `bcd node`: its own root, node key, certificate,
session, journal and simulated GPUs, through the same agent and session code, but all on one
event loop. A fleet of thousands, or `dev`'s eight machines, then costs one interpreter's
memory rather than one each. Machines not yet joined join first, a few at a time, each
retried with backoff (one join token with as many uses as machines). Each machine's log lines
go to a file of its own, as a process of its own would have written them.

What this mode cannot show is one machine's agent dying alone: tests that kill an agent run
machines one per process (`bcd node`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from bcd.agent import Agent
from bcd.config import Config, Paths, joined_config
from bcd.join.client import join
from bcd.join.documents import JoinError, JoinRefused, Pins

logger = logging.getLogger("bcd")
MACHINE: contextvars.ContextVar[str] = contextvars.ContextVar("bcd_machine", default="")
JOIN_ATTEMPTS = 4
JOIN_BACKOFF_SECONDS = 1.0  # before the second attempt; doubled for each after
EVENTS_SECONDS = 1.0  # how often every machine's GPU events are looked at


@dataclass(frozen=True)
class Joining:
    """How the machines not yet joined join: where, with which token and pins, as what."""

    server: str
    token: str
    pins: Pins
    variant: str = "gpu"
    gpus: int = 8
    hostname: Callable[[Path], str | None] = lambda root: None
    at_once: int = 8  # joins in flight together: a fleet's first start is paced


class MachineLogs(logging.Handler):
    """Each machine's records to `<folder>/sim-<root name>.log`; a record made outside any
    machine (the process's own) to `fallback`."""

    def __init__(self, folder: Path, fallback: logging.Handler) -> None:
        super().__init__()
        self.folder = folder
        self.fallback = fallback
        self.files: dict[str, logging.FileHandler] = {}

    def emit(self, record: logging.LogRecord) -> None:
        machine = MACHINE.get()
        if not machine:
            self.fallback.handle(record)
            return
        handler = self.files.get(machine)
        if handler is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(self.folder / f"sim-{machine}.log")
            handler.setFormatter(self.formatter)
            self.files[machine] = handler
        handler.handle(record)

    def close(self) -> None:
        for handler in self.files.values():
            handler.close()
        super().close()


def log_per_machine(folder: Path | None) -> None:
    """The process's logging: one file per machine under `folder`, else all on stderr with
    the machine's name in front."""
    fallback = logging.StreamHandler()
    if folder is None:
        fallback.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(machine)s %(message)s"))
        fallback.addFilter(_named)
        logging.basicConfig(level=logging.INFO, handlers=[fallback])
        return
    fallback.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler = MachineLogs(folder, fallback)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def _named(record: logging.LogRecord) -> bool:
    record.machine = MACHINE.get() or "-"
    return True


async def join_one(root: Path, joining: Joining) -> Config:
    """Join the machine at `root`, retried with jittered backoff when the control plane was
    not reached or did not answer (busy with a whole fleet's joins); a refusal is final at
    once (asked again, it would only be refused and audited again)."""
    MACHINE.set(root.name)
    delay = JOIN_BACKOFF_SECONDS
    for attempt in range(1, JOIN_ATTEMPTS + 1):
        try:
            config, not_after = await asyncio.to_thread(
                join, server=joining.server, pins=joining.pins, token=joining.token,
                root=root, sim=True, sim_gpus=joining.gpus, sim_variant=joining.variant,
                hostname=joining.hostname(root))
        except JoinRefused as refusal:
            raise JoinError(f"{root.name}: {refusal}") from refusal
        except (JoinError, OSError, grpc.RpcError) as failure:  # not reached, no answer
            if attempt == JOIN_ATTEMPTS:
                raise JoinError(f"{root.name}: {failure}") from failure
            logger.warning("join attempt %d failed: %s; trying again", attempt, failure)
            await asyncio.sleep(random.uniform(delay / 2, delay))  # noqa: S311 (jitter)
            delay *= 2
            continue
        logger.info("joined as %s; certificate valid until %s", config.node_id, not_after)
        return config
    raise AssertionError("unreachable")


async def join_all(roots: list[Path], joining: Joining | None) -> list[Config]:
    """Every machine's config: read when it joined before, else joined (at most
    `joining.at_once` at a time)."""
    waiting = [root for root in roots if joined_config(Paths(root)) is None]
    if waiting and joining is None:
        raise JoinError(f"{len(waiting)} machine(s) have not joined ({waiting[0].name}, ...) "
                        "and no join token was given")
    if waiting and joining is not None:
        gate = asyncio.Semaphore(joining.at_once)

        async def paced(root: Path) -> Config:
            async with gate:
                return await join_one(root, joining)

        await asyncio.gather(*(asyncio.create_task(paced(root)) for root in waiting))
    configs = [joined_config(Paths(root)) for root in roots]
    return [config for config in configs if config is not None]


async def run_machines(roots: list[Path], *, joining: Joining | None = None,
                       places: dict[str, str] | None = None) -> None:
    """Join what has not joined, then run every machine's agent until SIGINT or SIGTERM;
    one machine's agent failing stops them all (the supervisor restarts the process, and
    each agent's journal makes that safe, as for one)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    joined = asyncio.create_task(join_all(roots, joining))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([joined, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not joined.done():  # stopped while joining: the joins in flight are dropped
        joined.cancel()
        await asyncio.gather(joined, return_exceptions=True)
        return
    stopping.cancel()
    configs = joined.result()
    logger.info("running %d simulated machines in this process", len(configs))

    machines = [Agent(config, place=(places or {}).get(Path(config.root).name),
                      events_looked_at=True) for config in configs]

    async def run_one(agent: Agent) -> None:
        MACHINE.set(Path(agent.config.root).name)  # this task's context: its tasks inherit it
        await agent.run(stop)

    agents = [asyncio.create_task(run_one(agent)) for agent in machines]
    stopped = threading.Event()
    looking = threading.Thread(target=look_at_events, args=(machines, stopped),
                               name="gpu-events", daemon=True)
    looking.start()
    try:
        done, _ = await asyncio.wait(agents, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        stop.set()
        stopped.set()
        await asyncio.gather(*agents, return_exceptions=True)


def look_at_events(agents: list[Agent], stopped: threading.Event) -> None:
    """Every machine's GPU events (XIDs), each in turn every `EVENTS_SECONDS`, on one
    thread: a thread per machine, each waking five times a second, would cost a fleet of
    thousands its cores."""
    while not stopped.wait(EVENTS_SECONDS):
        for agent in agents:
            MACHINE.set(Path(agent.config.root).name)  # this thread's: its lines go there
            try:
                agent.inventory.take_events()
            except Exception:  # one machine's fault must not blind the others
                logger.exception("looking at GPU events failed")
