"""The API's threads go to the waiting tenant with the fewest calls running."""

from __future__ import annotations

import asyncio

import pytest

from compute.core.errors import TooManyRequests
from compute.http.fair import FairSlots, learn, request_key


def test_a_free_thread_goes_to_the_tenant_with_the_fewest_running_and_a_burst_is_capped():
    async def scenario() -> list[str]:
        slots = FairSlots(["t1"], limit=4)
        order: list[str] = []
        held = await slots.acquire("a")

        async def call(key: str) -> None:
            slot = await slots.acquire(key)
            order.append(key)
            await asyncio.sleep(0)
            slots.release(key, slot)

        burst = [asyncio.create_task(call("a")) for _ in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(TooManyRequests):
            await slots.acquire("a")  # 4 in flight already
        other = asyncio.create_task(call("b"))
        await asyncio.sleep(0)
        slots.release("a", held)
        await asyncio.gather(*burst, other)
        return order

    assert asyncio.run(scenario()) == ["b", "a", "a", "a"]


def test_a_request_counts_against_its_tenant_once_its_token_is_known():
    scope = {"headers": [(b"authorization", b"Bearer biam_tok_x1.secret")],
             "client": ("10.0.0.1", 1)}
    assert request_key(scope) == "token:biam_tok_x1"
    learn("biam_tok_x1.secret", "tnt_acme")
    assert request_key(scope) == "tnt_acme"
    assert request_key({"headers": [], "client": ("10.0.0.9", 5)}) == "address:10.0.0.9"
