"""The per-agent count of requests in flight: the cap, exactly-once release, and a slot held
through forwarding work that its waiter has stopped waiting for."""

from __future__ import annotations

import asyncio

import pytest

from proxy.gate.checks import Agent
from proxy.gate.limits import AgentSlots

A = Agent(agent_id="agent-a", tenant="t1")
SAME_ID_OTHER_TENANT = Agent(agent_id="agent-a", tenant="t2")


def test_the_cap_refuses_one_more_and_counts_agents_separately() -> None:
    """Up to the cap an agent gets slots, then None; another tenant's agent of the same id
    has its own count."""
    slots = AgentSlots()
    taken = [slots.take(A, 2), slots.take(A, 2)]
    assert all(taken)
    assert slots.take(A, 2) is None
    assert slots.take(SAME_ID_OTHER_TENANT, 2) is not None
    assert (slots.count(A), slots.count(SAME_ID_OTHER_TENANT)) == (2, 1)


def test_a_slot_is_given_back_once_however_often_it_is_released() -> None:
    """Releasing twice frees one place, not two; the count returns to zero."""
    slots = AgentSlots()
    first, second = slots.take(A, 2), slots.take(A, 2)
    assert first is not None
    assert second is not None
    first.release()
    first.release()
    assert slots.count(A) == 1
    second.release()
    assert slots.count(A) == 0
    assert slots.take(A, 1) is not None


async def test_work_holds_the_slot_after_its_waiter_is_cancelled() -> None:
    """A shielded forward whose waiter is cancelled (the agent hung up) keeps the slot until
    the work itself ends; the waiter's own release in its finally changes nothing."""
    slots = AgentSlots()
    slot = slots.take(A, 1)
    assert slot is not None
    started, may_finish = asyncio.Event(), asyncio.Event()

    async def forward_and_record() -> str:
        started.set()
        await may_finish.wait()
        return "recorded"

    async def request() -> str:
        try:
            return await asyncio.shield(slot.held_through(forward_and_record()))
        finally:
            slot.release()

    waiter = asyncio.create_task(request())
    await started.wait()  # the work is running behind its shield
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.count(A) == 1
    assert slots.take(A, 1) is None
    may_finish.set()
    async with asyncio.timeout(5):
        while slots.count(A):  # noqa: ASYNC110  (the work's finally runs on the loop)
            await asyncio.sleep(0)
    assert slots.take(A, 1) is not None
