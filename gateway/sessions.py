"""One node session: three lanes with credits in each direction.

Gateway -> agent: control (commands, renewals, acks of control reports), provision and bulk
(acks of bulk reports). A message goes out only while its lane has credits, which the agent
grants; control always goes first. Agent -> gateway: the agent may send bulk reports
(inventory, telemetry) only within the credits the gateway grants, so a bulk flood can never
block the stream in front of a control message, and control reports are processed first.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bcd.contract.proto import agent_pb2 as pb

LANES = (pb.CONTROL, pb.PROVISION, pb.BULK)
INITIAL_OUT_CREDITS = {pb.CONTROL: 64, pb.PROVISION: 8, pb.BULK: 32}
BULK_WINDOW = 16  # bulk reports the agent may have in flight


@dataclass
class Session:
    node_id: str
    epoch: int
    outgoing: dict[int, deque[pb.GatewayMessage]] = field(
        default_factory=lambda: {lane: deque() for lane in LANES})
    credits: dict[int, int] = field(default_factory=lambda: dict(INITIAL_OUT_CREDITS))
    # Plain deques, not asyncio queues: `incoming` is what a reader waits on (an asyncio
    # queue costs three deques; a gateway holds one session per node).
    control_in: deque[pb.AgentMessage] = field(default_factory=deque)
    bulk_in: deque[pb.AgentMessage] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    incoming: asyncio.Event = field(default_factory=asyncio.Event)
    closed: str = ""
    bulk_outstanding: int = 0

    def send(self, message: pb.GatewayMessage) -> None:
        self.outgoing[message.lane].append(message)
        self.wake.set()

    def close(self, reason: str) -> None:
        if not self.closed:
            self.closed = reason
            self.wake.set()
            self.incoming.set()

    def grant(self, lane: int, credits: int) -> None:
        self.credits[lane] = self.credits.get(lane, 0) + credits
        self.wake.set()

    def next_outgoing(self) -> pb.GatewayMessage | None:
        """The next message allowed out: control first, each lane within its credits."""
        for lane in LANES:
            if self.outgoing[lane] and self.credits.get(lane, 0) > 0:
                self.credits[lane] -= 1
                return self.outgoing[lane].popleft()
        return None

    def accept(self, message: pb.AgentMessage) -> str:
        """Route an incoming message to its lane; an error text refuses the session."""
        if message.epoch != self.epoch:
            return f"message of session epoch {message.epoch}; the current epoch is {self.epoch}"
        kind = message.WhichOneof("body")
        if kind in ("inventory", "telemetry"):
            self.bulk_outstanding += 1
            if self.bulk_outstanding > BULK_WINDOW:
                return "bulk reports beyond the granted credits"
            self.bulk_in.append(message)
        else:
            self.control_in.append(message)
        self.incoming.set()
        return ""

    def next_incoming(self) -> pb.AgentMessage | None:
        for queue in (self.control_in, self.bulk_in):
            if queue:
                return queue.popleft()
        return None

    async def outgoing_message(self) -> pb.GatewayMessage | None:
        """The next message allowed out, waiting for one; None once the session closed."""
        return await self._take(self.next_outgoing, self.wake)

    async def incoming_message(self) -> pb.AgentMessage | None:
        """The next message to process (control first), waiting; None once closed."""
        return await self._take(self.next_incoming, self.incoming)

    async def _take(self, take: Callable[[], Any], ready: asyncio.Event) -> Any:
        while not self.closed:
            message = take()
            if message is not None:
                return message
            ready.clear()
            await ready.wait()
        return None
