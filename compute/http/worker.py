"""The API's worker process under gunicorn: uvicorn serving the ASGI application."""

from __future__ import annotations

import os
import signal
from typing import Any, ClassVar

from uvicorn_worker import UvicornWorker


class ApiWorker(UvicornWorker):
    """A uvicorn worker that also stops when its master is gone (killed with -9): an orphan
    would keep accepting on the inherited socket while a new master cannot bind it."""

    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "loop": "auto", "http": "auto",
        "timeout_notify": 2,  # how often the master's liveness is checked, in seconds
    }

    async def callback_notify(self) -> None:
        if os.getppid() != self.ppid:
            self.log.warning("the API's master process is gone: worker %s stops", self.pid)
            os.kill(os.getpid(), signal.SIGTERM)  # uvicorn drains its connections and exits
        self.notify()
