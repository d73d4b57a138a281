"""The store's connections against a real PostgreSQL: a connection that ended its call cleanly
is handed to the next call without a trip through asyncpg's pool, and every other one goes
back to the pool, which resets, replaces or closes it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from proxy.store.connections import Connections
from tests.support.polling import Clock, until


@contextlib.asynccontextmanager
async def _opened(database_url: str, max_size: int) -> AsyncIterator[asyncpg.Pool]:
    opened = await asyncpg.create_pool(database_url, min_size=1, max_size=max_size)
    try:
        yield opened
    finally:
        opened.terminate()  # the tests close their Connections; this only ends a failed one's


@pytest_asyncio.fixture(loop_scope="session")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    async with _opened(database_url, max_size=2) as opened:
        yield opened


@pytest_asyncio.fixture(loop_scope="session")
async def one(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool of one connection: a second call must wait for it."""
    async with _opened(database_url, max_size=1) as opened:
        yield opened


class Holder:
    """A call that takes a connection and holds it until released, then ends with
    ``ending(conn)`` (the connection itself, unless told otherwise)."""

    def __init__(
        self, connections: Connections, ending: Callable[[Any], Any] = lambda conn: conn
    ) -> None:
        self._holding, self._released = asyncio.Event(), asyncio.Event()
        self._ending = ending
        self.task = asyncio.create_task(connections.run(self._hold))

    async def _hold(self, conn: Any) -> Any:
        self._holding.set()
        await self._released.wait()
        return self._ending(conn)

    async def holding(self) -> None:
        await self._holding.wait()

    def release(self) -> None:
        self._released.set()


async def _this(conn: Any) -> Any:
    return conn


def _fail(conn: Any) -> None:
    raise RuntimeError("the call failed")


async def test_a_cleanly_ended_call_hands_its_connection_to_the_next(pool: asyncpg.Pool) -> None:
    """The next call gets the very object the last call had: the pool lent nothing new (each
    of its acquires makes a new proxy object)."""
    connections = Connections(pool, acquire_timeout=2.0)
    try:
        first = await connections.run(_this)
        second = await connections.run(_this)
        assert second is first
        assert await connections.run(lambda conn: conn.fetchval("SELECT 1")) == 1
        assert connections.usage() == (pool.get_size(), pool.get_idle_size() + 1, 2)
    finally:
        await connections.close()


async def test_a_call_that_raised_gives_its_connection_back_rolled_back(
    pool: asyncpg.Pool,
) -> None:
    """A call that failed inside a transaction is not kept: the pool rolls the connection
    back, and the next call finds no transaction open."""
    connections = Connections(pool, acquire_timeout=2.0)

    async def fail_in_a_transaction(conn: Any) -> None:
        await conn.execute("BEGIN")
        await conn.execute("CREATE TEMP TABLE left_behind (x int)")
        raise RuntimeError("the call failed")

    try:
        with pytest.raises(RuntimeError):
            await connections.run(fail_in_a_transaction)
        after = await connections.run(_this)
        assert not after.is_in_transaction()
        found = await connections.run(
            lambda conn: conn.fetchval("SELECT to_regclass('pg_temp.left_behind')")
        )
        assert found is None
    finally:
        await connections.close()


async def test_a_call_that_left_a_transaction_open_is_not_handed_on(pool: asyncpg.Pool) -> None:
    """A call that returned with a transaction open (a bug in it) does not pass that
    transaction on: its connection goes back to the pool, which rolls it back."""
    connections = Connections(pool, acquire_timeout=2.0)

    async def leave_it_open(conn: Any) -> Any:
        await conn.execute("BEGIN")
        return conn

    try:
        leaky = await connections.run(leave_it_open)
        after = await connections.run(_this)
        assert after is not leaky
        assert not after.is_in_transaction()
    finally:
        await connections.close()


async def test_a_cancelled_call_gives_its_connection_back(pool: asyncpg.Pool) -> None:
    """A call cancelled mid-statement is not kept: the pool waits out the cancelled statement,
    and the next call gets a connection that answers."""
    connections = Connections(pool, acquire_timeout=2.0)
    started = asyncio.Event()
    seen: list[Any] = []

    async def long_statement(conn: Any) -> None:
        seen.append(conn)
        started.set()
        await conn.execute("SELECT pg_sleep(30)")

    async def sleeping_on_the_server() -> bool:
        # A cancel request that reaches the server before the statement runs cancels nothing
        # (the server then sleeps the whole 30 s): cancel once the server is in it.
        return bool(
            await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE state = 'active' AND query = 'SELECT pg_sleep(30)'"
            )
        )

    try:
        running = asyncio.create_task(connections.run(long_statement))
        await started.wait()
        await until(sleeping_on_the_server, "the statement runs on the server")
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        after = await connections.run(_this)
        assert after is not seen[0]
        assert await connections.run(lambda conn: conn.fetchval("SELECT 2")) == 2
    finally:
        await connections.close()


async def test_a_waiting_call_is_handed_the_connection_a_call_ends_with(
    one: asyncpg.Pool,
) -> None:
    """With the only connection in a call, the next call waits; when the first call ends, its
    connection goes straight to the waiting call (the same object: not through the pool)."""
    connections = Connections(one, acquire_timeout=5.0)
    holder = Holder(connections)
    try:
        await holder.holding()
        waiter = asyncio.create_task(connections.run(_this))
        await until(lambda: connections.waiting == 1, "the second call waits")
        holder.release()
        held = await holder.task
        assert await asyncio.wait_for(waiter, timeout=4.0) is held
    finally:
        holder.release()
        await connections.close()


async def test_a_waiting_call_takes_the_place_of_a_connection_given_back(
    one: asyncpg.Pool,
) -> None:
    """When the call that had the only connection fails, that connection goes back to the pool
    and its place to the waiting call, which then takes a connection from the pool."""
    connections = Connections(one, acquire_timeout=5.0)
    holder = Holder(connections, ending=_fail)
    try:
        await holder.holding()
        waiter = asyncio.create_task(connections.run(lambda conn: conn.fetchval("SELECT 6")))
        await until(lambda: connections.waiting == 1, "the second call waits")
        holder.release()
        with pytest.raises(RuntimeError):
            await holder.task
        assert await asyncio.wait_for(waiter, timeout=4.0) == 6
    finally:
        holder.release()
        await connections.close()


async def test_a_connection_handed_to_a_call_cancelled_meanwhile_is_not_lost(
    one: asyncpg.Pool,
) -> None:
    """A waiting call cancelled after a connection was handed to it, before it ran again,
    passes the connection on: the next call gets it, instead of waiting for a place that no
    connection holds any more."""
    connections = Connections(one, acquire_timeout=2.0)
    waiters: list[asyncio.Task[Any]] = []

    def cancel_the_waiter(conn: Any) -> Any:
        # runs after the holder has handed its connection on, before the waiter wakes
        asyncio.get_running_loop().call_soon(waiters[0].cancel)
        return conn

    holder = Holder(connections, ending=cancel_the_waiter)
    try:
        await holder.holding()
        waiters.append(asyncio.create_task(connections.run(_this)))
        await until(lambda: connections.waiting == 1, "the second call waits")
        holder.release()
        held = await holder.task
        with pytest.raises(asyncio.CancelledError):
            await waiters[0]
        assert await connections.run(_this) is held
        await asyncio.wait_for(connections.close(), timeout=5.0)
    finally:
        holder.release()
        one.terminate()  # a lost connection would make closing wait for ever


async def test_a_full_pool_still_fails_after_the_acquire_timeout(one: asyncpg.Pool) -> None:
    """With every connection in a call, the next call waits the acquire timeout and then
    raises: a connection kept ready is not one the pool could lend."""
    connections = Connections(one, acquire_timeout=0.2)
    await connections.run(_this)  # one ready: the holder below takes it
    holder = Holder(connections)
    try:
        await holder.holding()
        with pytest.raises(asyncio.TimeoutError):
            await connections.run(_this)
        holder.release()
        await holder.task
        assert await connections.run(lambda conn: conn.fetchval("SELECT 4")) == 4
    finally:
        holder.release()
        await connections.close()


async def test_a_connection_closed_while_ready_is_not_handed_out(pool: asyncpg.Pool) -> None:
    """A ready connection that was closed meanwhile (the server went away) goes back to the
    pool, which opens another; the call gets that one."""
    connections = Connections(pool, acquire_timeout=2.0)
    try:
        ready = await connections.run(_this)
        ready.terminate()
        after = await connections.run(_this)
        assert after is not ready
        assert await connections.run(lambda conn: conn.fetchval("SELECT 5")) == 5
    finally:
        await connections.close()


async def test_connections_idle_for_long_go_back_to_the_pool(pool: asyncpg.Pool) -> None:
    """Ready connections unused for keep_idle_seconds go back to the pool, oldest first, where
    its own idle lifetime applies; the recently used stay ready."""
    clock = Clock()
    connections = Connections(pool, acquire_timeout=2.0, keep_idle_seconds=10.0, clock=clock)
    both = asyncio.Event()
    entered: list[Any] = []

    async def together(conn: Any) -> Any:
        entered.append(conn)
        if len(entered) == 2:
            both.set()
        await both.wait()
        return conn

    try:
        await asyncio.gather(connections.run(together), connections.run(together))
        assert connections.usage()[1] == pool.get_idle_size() + 2
        clock.now += 11.0
        newest = await connections.run(_this)  # used again now: kept with a new time
        await connections.give_back_idle()
        assert await connections.run(_this) is newest
        assert connections.usage()[1] == pool.get_idle_size() + 1
        assert pool.get_idle_size() == 1  # the other one is the pool's again
    finally:
        await connections.close()


async def test_a_connection_goes_back_to_the_pool_after_its_calls(pool: asyncpg.Pool) -> None:
    """After recycle_after_calls calls a connection goes back to the pool (which replaces one
    that has run its max_queries), and the next call is lent another by the pool."""
    connections = Connections(pool, acquire_timeout=2.0, recycle_after_calls=3)
    try:
        used = [await connections.run(_this) for _ in range(4)]
        assert used[0] is used[1] is used[2]
        assert used[3] is not used[0]
    finally:
        await connections.close()


async def test_closing_waits_for_a_running_call_and_gives_everything_back(
    pool: asyncpg.Pool,
) -> None:
    """Closing while a call runs: the ready connections go back at once, the running call's
    when it ends (not to the ready ones), and the pool closes."""
    connections = Connections(pool, acquire_timeout=2.0)
    await connections.run(_this)  # one ready
    holder = Holder(connections, ending=lambda conn: "ended")
    try:
        await holder.holding()
        closing = asyncio.create_task(connections.close())
        await until(pool.is_closing, "closing reached the pool")  # the pool waits for the call
        holder.release()
        assert await holder.task == "ended"
        await asyncio.wait_for(closing, timeout=5.0)
        assert connections.usage()[1] == 0
    finally:
        holder.release()
