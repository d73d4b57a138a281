"""The per-agent count of requests in flight: the cap, exactly-once release, and a slot held
through forwarding work that its waiter has stopped waiting for; rate limits (token buckets on
a controlled clock) and in-flight caps per agent and per tenant."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.limits import AgentSlots, Slot, TokenBucket
from proxy.gate.reasons import Reason
from proxy.policy.load import parse_policy_text
from proxy.policy.model import Provider
from tests.support.opgate import make_settings
from tests.support.polling import Clock, until

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
    await until(lambda: not slots.count(A), "the work's finally gave the slot back")
    assert slots.take(A, 1) is not None


def provider(rate_limits: str = "") -> Provider:
    text = (
        "version: 1\nprovider: pay\nroute_prefix: /pay\nupstream: https://pay.example\n"
        + rate_limits
        + "rules:\n  - {name: read, method: GET, path: /v1/x, operation: none, body: none}\n"
    )
    parsed, problems = parse_policy_text(text, "pay.yaml")
    assert problems == []
    assert parsed is not None
    return parsed


SETTINGS = make_settings("postgresql://unused", Path("unused"))


def test_a_token_bucket_gives_its_burst_then_one_token_per_period() -> None:
    """A bucket of 3 at 2 per second: three at once, then the fourth waits half a second,
    and a clock stepping back refills nothing."""
    clock = Clock()
    bucket = TokenBucket(2.0, 3, clock.now)
    for _ in range(3):
        assert bucket.wait(clock.now) == 0
        bucket.take(clock.now)
    assert bucket.wait(clock.now) == pytest.approx(0.5)
    clock.now += 0.25
    assert bucket.wait(clock.now) == pytest.approx(0.25)
    clock.now += 0.25
    assert bucket.wait(clock.now) == 0
    bucket.take(clock.now)
    clock.now -= 10
    assert bucket.wait(clock.now) == pytest.approx(0.5)
    clock.now += 100  # a long quiet spell refills up to the burst, not beyond
    for _ in range(3):
        bucket.take(clock.now)
    assert bucket.wait(clock.now) > 0


def test_an_agent_over_its_rate_is_refused_with_retry_after_and_others_are_not() -> None:
    """Per agent 1 request per second, burst 2: the third request at once is rate_limited
    with Retry-After 1; another agent of the tenant is not; a second later one more passes."""
    clock = Clock()
    slots = AgentSlots(clock)
    pay = provider("rate_limits: {per_agent: {requests_per_second: 1, burst: 2}}\n")
    admitted = [slots.admit(A, pay, SETTINGS) for _ in range(3)]
    assert [isinstance(a, Slot) for a in admitted] == [True, True, False]
    refused = admitted[2]
    assert isinstance(refused, Deny)
    assert (refused.reason, refused.retry_after_seconds) == (Reason.RATE_LIMITED, 1)
    assert isinstance(slots.admit(Agent("agent-c", "t1"), pay, SETTINGS), Slot)
    clock.now += 1.0
    assert isinstance(slots.admit(A, pay, SETTINGS), Slot)
    assert isinstance(slots.admit(A, pay, SETTINGS), Deny)


def test_a_tenant_rate_is_shared_by_its_agents() -> None:
    """Per tenant 3 per second (settings): three requests of two agents of t1 pass, the
    fourth is refused; t2 has its own bucket. A refusal takes no token."""
    clock = Clock()
    slots = AgentSlots(clock)
    settings = make_settings(
        "postgresql://unused", Path("unused"), requests_per_second_per_tenant=3
    )
    pay, c = provider(), Agent("agent-c", "t1")
    answers = [slots.admit(who, pay, settings) for who in (A, c, A, c)]
    assert [isinstance(a, Slot) for a in answers] == [True, True, True, False]
    assert isinstance(slots.admit(SAME_ID_OTHER_TENANT, pay, settings), Slot)
    clock.now += 1 / 3
    assert isinstance(slots.admit(c, pay, settings), Slot)


def test_in_flight_caps_per_tenant_count_until_released() -> None:
    """A provider's per-tenant in-flight cap of 2 refuses a third request of any agent of the
    tenant while two are held, and admits again once one is released; refusals hold nothing."""
    slots = AgentSlots(Clock())
    pay = provider("rate_limits: {per_tenant: {in_flight: 2}}\n")
    first, second = slots.admit(A, pay, SETTINGS), slots.admit(A, pay, SETTINGS)
    assert isinstance(first, Slot)
    assert isinstance(second, Slot)
    refused = slots.admit(Agent("agent-c", "t1"), pay, SETTINGS)
    assert isinstance(refused, Deny)
    assert refused.reason is Reason.RATE_LIMITED
    first.release()
    assert isinstance(slots.admit(Agent("agent-c", "t1"), pay, SETTINGS), Slot)
    assert slots.count(A) == 1
