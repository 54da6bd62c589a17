"""Lightweight node sessions for bench.gateway: the agent's own session code (mTLS,
Hello/Welcome, heartbeats every 10 s) with a simulated inventory, many per process.

    python -m bench.session_clients --nodes FILE --target HOST:PORT [--plain]

FILE is JSON: a list of [key PEM, certificate PEM, CA PEM]. A session that fails or ends
connects again after a pause. Prints `connected N` whenever the count changes, and runs
until it is terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
from pathlib import Path
from typing import Any


async def run(nodes: list[list[str]], target: str, plain: bool, ramp: float) -> None:
    import grpc
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from bcd.inventory.fake import SimulatedInventory
    from bcd.session import AgentSession, Credentials

    if plain:
        Credentials.channel = (  # type: ignore[method-assign]
            lambda self, target, server_name=None: grpc.aio.insecure_channel(target))

    async def no_commands(command_id: str, kind: str, payload: dict[str, Any]
                          ) -> tuple[str, dict[str, Any]]:
        return "failed", {}

    sessions = [AgentSession(
        credentials=Credentials(load_pem_private_key(key.encode(), None),  # type: ignore[arg-type]
                                cert.encode(), ca.encode()),
        target=target, inventory=SimulatedInventory(f"bench-{n}"), run_command=no_commands)
        for n, (key, cert, ca) in enumerate(nodes)]

    async def keep(session: AgentSession) -> None:
        """Run the session; when it fails or ends, connect again after a random pause (as
        the agent does), so a gateway busy with a reconnecting fleet is not given up on."""
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await session.run()
            await asyncio.sleep(random.uniform(1, 5))

    async def tell() -> None:
        told = -1
        while True:
            connected = sum(s.state.connected for s in sessions)
            if connected != told:
                print(f"connected {connected}", flush=True)
                told = connected
            await asyncio.sleep(0.5)

    teller = asyncio.create_task(tell())
    tasks = []
    for session in sessions:
        tasks.append(asyncio.create_task(keep(session)))
        await asyncio.sleep(ramp)  # a gentle ramp, like a fleet coming back
    await teller


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--ramp", type=float, default=0.005)
    args = parser.parse_args()
    asyncio.run(run(json.loads(Path(args.nodes).read_text()), args.target, args.plain,
                    args.ramp))


if __name__ == "__main__":
    main()
