"""Readiness's own connection (proxy/store/readiness.py): outside the pool, under a budget."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from proxy.errors import StoreUnavailable
from proxy.store.store import Store


async def test_readiness_answers_while_every_pooled_connection_is_held(database_url: str) -> None:
    """The pool's one connection held by a call that waits: readiness still answers at once."""
    store = await Store.open(database_url, min_size=1, max_size=1, acquire_timeout=5)
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold(conn: asyncpg.Connection) -> None:
        held.set()
        await release.wait()

    holder = asyncio.create_task(store.run(hold))
    try:
        await held.wait()
        started = time.monotonic()
        verdict = await store.readiness(
            accept_async=False, commit_timeout_seconds=0.5, budget_seconds=0.8
        )
        assert verdict.ready
        assert time.monotonic() - started < 0.8
    finally:
        release.set()
        await holder
        await store.close()


async def test_readiness_past_its_budget_is_store_unavailable(database_url: str) -> None:
    """A check that cannot end within the budget (its heartbeat row locked by another
    session) is StoreUnavailable in about the budget, and the next check connects anew."""
    store = await Store.open(database_url, min_size=1, max_size=1)
    locker = await asyncpg.connect(database_url)
    try:
        transaction = locker.transaction()
        await transaction.start()
        await locker.execute("SELECT * FROM opgate_heartbeat FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="within"):
            await store.readiness(accept_async=False, commit_timeout_seconds=5, budget_seconds=0.3)
        assert time.monotonic() - started < 1.0
        await transaction.rollback()
        verdict = await store.readiness(
            accept_async=False, commit_timeout_seconds=0.5, budget_seconds=0.8
        )
        assert verdict.ready
    finally:
        await locker.close()
        await store.close()
