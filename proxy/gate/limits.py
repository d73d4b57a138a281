"""How many requests agents and tenants have in flight in this process, how fast they send,
and the caps on both.

A request is admitted once its agent and provider are identified, before the body is read or
the database is touched, and gives its slot back when its answer is decided: one agent (or
tenant) cannot queue enough requests to hold the database pool, or the provider's
connections, against every other. A request that has been forwarded keeps its slot until its
outcome is recorded, even if the agent hangs up (``Slot.held_through``): it is still in flight
as far as the provider and the row are concerned.

Three limits, checked in this order, all before anything is taken (a refused request costs
no slot and no token):

1. ``max_requests_in_flight_per_agent`` (settings, every provider): 429
   ``agent_concurrency_exceeded``.
2. In flight per agent / per tenant: a provider's ``rate_limits.per_agent|per_tenant.in_flight``
   (that provider's requests) and ``max_requests_in_flight_per_tenant`` (settings, all of
   them): 429 ``rate_limited``.
3. Requests per second per agent / per tenant: a token bucket per key, from the provider's
   ``rate_limits`` (``requests_per_second``, ``burst``) and the settings'
   ``requests_per_second_per_agent|tenant`` (all providers): 429 ``rate_limited`` with the
   seconds until the next token as ``Retry-After``.

All of it is per process (one event loop, no lock needed): a replica with W workers admits up
to W times each limit, R replicas R x W times. Money is capped exactly elsewhere (budgets, in
the database); these limits protect opgate and the providers, for which per-replica is enough.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.reasons import Reason
from proxy.policy.budgets import RateLimit
from proxy.policy.model import Provider
from proxy.settings import Settings

T = TypeVar("T")
Clock = Callable[[], float]
Key = tuple[str, ...]


class TokenBucket:
    """``size`` tokens, refilled continuously at ``rate`` per second; a request takes one."""

    def __init__(self, rate: float, size: int, now: float) -> None:
        self.rate, self.size = rate, size
        self._tokens, self._at = float(size), now

    def wait(self, now: float) -> float:
        """Seconds until a token is there (0: one is there now). Takes nothing."""
        self._refill(now)
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate

    def take(self, now: float) -> None:
        self._refill(now)
        self._tokens -= 1

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._at)  # a clock that steps back refills nothing
        self._tokens = min(float(self.size), self._tokens + elapsed * self.rate)
        self._at = now


@dataclass(frozen=True)
class _Rate:
    key: Key
    rate: float
    size: int
    who: str


@dataclass(frozen=True)
class _Cap:
    key: Key
    cap: int
    who: str


def _caps_and_rates(
    agent: Agent, provider: Provider | None, settings: Settings
) -> tuple[list[_Cap], list[_Rate]]:
    """The in-flight caps and token buckets that apply to one request of ``agent`` (to
    ``provider``; None: a request opgate answers itself, under the settings' limits only)."""
    me = f"agent {agent.agent_id}"
    tenant = f"tenant {agent.tenant}"
    caps: list[_Cap] = []
    rates: list[_Rate] = []
    scoped: tuple[tuple[RateLimit | None, Key, str, str], ...] = ()
    if provider is not None:
        name = provider.provider
        scoped = (
            (
                provider.rate_limits.per_agent,
                (name, "agent", agent.tenant, agent.agent_id),
                me,
                name,
            ),
            (provider.rate_limits.per_tenant, (name, "tenant", agent.tenant), tenant, name),
        )
    for limit, key, who, name in scoped:
        if limit is None:
            continue
        if limit.in_flight is not None:
            caps.append(_Cap(key, limit.in_flight, f"{who} on {name}"))
        if limit.requests_per_second is not None:
            rates.append(
                _Rate(key, limit.requests_per_second, limit.bucket_size, f"{who} on {name}")
            )
    tenant_cap = settings.max_requests_in_flight_per_tenant
    if tenant_cap is not None:
        caps.append(_Cap(("", "tenant", agent.tenant), tenant_cap, tenant))
    for rate, key, who in (
        (settings.requests_per_second_per_agent, ("", "agent", agent.tenant, agent.agent_id), me),
        (settings.requests_per_second_per_tenant, ("", "tenant", agent.tenant), tenant),
    ):
        if rate is not None:
            rates.append(_Rate(key, rate, max(1, math.ceil(rate)), who))
    return caps, rates


class AgentSlots:
    """Requests in flight by agent (tenant and id: agent ids are only unique per tenant) and
    by the other keys limits count on, and the token buckets of the request rates."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._in_flight: dict[Key, int] = {}
        self._buckets: dict[Key, TokenBucket] = {}
        self._clock = clock

    def take(self, agent: Agent, cap: int) -> Slot | None:
        """A slot for one more request of ``agent``, or None when it already has ``cap``."""
        key = (agent.tenant, agent.agent_id)
        if self._in_flight.get(key, 0) >= cap:
            return None
        return self._hold((key,))

    def admit(self, agent: Agent, provider: Provider | None, settings: Settings) -> Slot | Deny:
        """A slot for one request of ``agent`` to ``provider``, or the limit it is over.
        ``provider`` None: a request opgate answers itself (a proposal), under every limit the
        settings set for all of an agent's requests."""
        cap = settings.max_requests_in_flight_per_agent
        if self.count(agent) >= cap:
            return Deny(Reason.AGENT_CONCURRENCY_EXCEEDED, f"{cap} requests already in flight", 1)
        caps, rates = _caps_and_rates(agent, provider, settings)
        for limit in caps:
            if self._in_flight.get(limit.key, 0) >= limit.cap:
                detail = f"{limit.who}: {limit.cap} requests already in flight"
                return Deny(Reason.RATE_LIMITED, detail, 1)
        now = self._clock()
        buckets = [(rate, self._bucket(rate, now)) for rate in rates]
        for rate, bucket in buckets:
            wait = bucket.wait(now)
            if wait > 0:
                detail = f"{rate.who}: more than {rate.rate:g} requests per second"
                return Deny(Reason.RATE_LIMITED, detail, max(1, math.ceil(wait)))
        for _, bucket in buckets:
            bucket.take(now)
        return self._hold(((agent.tenant, agent.agent_id), *(c.key for c in caps)))

    def count(self, agent: Agent) -> int:
        return self._in_flight.get((agent.tenant, agent.agent_id), 0)

    def _bucket(self, rate: _Rate, now: float) -> TokenBucket:
        bucket = self._buckets.get(rate.key)
        if bucket is None or (bucket.rate, bucket.size) != (rate.rate, rate.size):
            bucket = self._buckets[rate.key] = TokenBucket(rate.rate, rate.size, now)  # (re)set
        return bucket

    def _hold(self, keys: tuple[Key, ...]) -> Slot:
        for key in keys:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
        return Slot(self, keys)

    def _give_back(self, keys: tuple[Key, ...]) -> None:
        for key in keys:
            left = self._in_flight[key] - 1
            if left:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]  # the map only holds keys with something in flight


class Slot:
    """One request's place in the counts it is held in; released exactly once."""

    def __init__(self, slots: AgentSlots, keys: tuple[Key, ...]) -> None:
        self._slots, self._keys = slots, keys
        self._released = False
        self._held_by_work = False

    def release(self) -> None:
        """Give the slot back (once), unless work it is held through is still running."""
        if self._released or self._held_by_work:
            return
        self._released = True
        self._slots._give_back(self._keys)

    def held_through(self, work: Awaitable[T]) -> Awaitable[T]:
        """``work`` holds the slot from now until it ends, whoever stops waiting for it: a
        ``release`` in the meantime (the request's ``finally``, on a hang-up) is a no-op."""
        self._held_by_work = True  # set now, not when ``work`` first runs
        return self._release_after(work)

    async def _release_after(self, work: Awaitable[T]) -> T:
        try:
            return await work
        finally:
            self._held_by_work = False
            self.release()
