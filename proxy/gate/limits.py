"""How many requests one agent has in flight in this process, and the cap on it.

A request takes a slot once its agent is identified, before the body is read or the database
is touched, and gives it back when its answer is decided: one agent cannot queue enough
requests to hold the database pool, or the provider's connections, against every other
agent. A request that has been forwarded keeps its slot until its outcome is recorded, even if
the agent hangs up (``Slot.held_through``): it is still in flight as far as the provider and
the row are concerned.

Counts are per process (one event loop, no lock needed): a replica with W workers admits up to
W x the cap per agent.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from proxy.gate.checks import Agent

T = TypeVar("T")


class AgentSlots:
    """Requests in flight, by agent (tenant and id: agent ids are only unique per tenant)."""

    def __init__(self) -> None:
        self._in_flight: dict[tuple[str, str], int] = {}

    def take(self, agent: Agent, cap: int) -> Slot | None:
        """A slot for one more request of ``agent``, or None when it already has ``cap``."""
        key = (agent.tenant, agent.agent_id)
        held = self._in_flight.get(key, 0)
        if held >= cap:
            return None
        self._in_flight[key] = held + 1
        return Slot(self, key)

    def count(self, agent: Agent) -> int:
        return self._in_flight.get((agent.tenant, agent.agent_id), 0)

    def _give_back(self, key: tuple[str, str]) -> None:
        left = self._in_flight[key] - 1
        if left:
            self._in_flight[key] = left
        else:
            del self._in_flight[key]  # the map only holds agents with something in flight


class Slot:
    """One request's place in its agent's count; released exactly once."""

    def __init__(self, slots: AgentSlots, key: tuple[str, str]) -> None:
        self._slots, self._key = slots, key
        self._released = False
        self._held_by_work = False

    def release(self) -> None:
        """Give the slot back (once), unless work it is held through is still running."""
        if self._released or self._held_by_work:
            return
        self._released = True
        self._slots._give_back(self._key)

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
