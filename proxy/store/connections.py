"""The store's database connections: asyncpg's pool, with the connections that have just ended
a call cleanly handed to the next call directly.

Why: a call's trip through asyncpg's pool costs about as much CPU as its statement (measured in
bench/README.md: ~40-50 us per call on a 2-core machine, against ~60 us for a one-row
statement). The acquire runs the pool's queue and makes a proxy object; the release runs a
shielded task that resets the connection under a timeout. A request makes three store calls.
A connection whose call returned with no transaction open has nothing to reset (opgate leaves
no session state: no LISTEN, no session locks, no SET), so it goes as it is to the call that
waits longest for one, or is kept ready for the next call.

There are never more connections out of the pool than its size. A call that finds none ready
and all of them out waits here, in order of arrival, at most the acquire timeout: for a
connection handed on, or for a place freed by one that went back to the pool (it then takes
one from the pool).

The pool still owns every connection's life: it opens them, resets them, closes and replaces
them. A connection goes back to it

- when its call raised or was cancelled: the pool rolls back, waits out a cancelled statement,
  or terminates the connection; one that reached a server that is not a writable primary (a
  standby, a read-only database: ``faults.drops_connection``) is terminated first, so that
  the pool connects anew (to the new primary, with ``target_session_attrs=read-write``);
- when its call returned with a transaction open, or with the connection closed;
- when it has waited here unused for ``keep_idle_seconds``: the pool's own idle lifetime then
  applies, as it does to a connection it never lent;
- after ``recycle_after_calls`` calls: the pool then replaces it, as it replaces one that has
  run its ``max_queries``;
- when the store closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import asyncpg

from proxy.errors import StoreUnavailable
from proxy.store.faults import drops_connection, is_unavailable

T = TypeVar("T")

# Long enough that a connection stays ready between the calls of a steady load, short against
# the pool's idle lifetime (asyncpg's 300 s), which takes over once it is given back.
KEEP_IDLE_SECONDS = 10.0
# asyncpg's max_queries: after this many queries the pool replaces a connection (on a release).
# A connection used this many times here goes back to it, so that replacement still happens.
RECYCLE_AFTER_CALLS = 50_000


class _Ready(NamedTuple):
    conn: Any
    kept_at: float
    calls: int  # calls it has served since the pool lent it


# What a waiting call is given: a connection, or (None) a place to take one from the pool.
_Handed = _Ready | None


class Connections:
    def __init__(
        self,
        pool: asyncpg.Pool,
        acquire_timeout: float,
        *,
        keep_idle_seconds: float = KEEP_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        recycle_after_calls: int = RECYCLE_AFTER_CALLS,
    ) -> None:
        self._pool = pool
        self._acquire_timeout = acquire_timeout
        self._max_size = pool.get_max_size()
        self._keep_idle_seconds = keep_idle_seconds
        self._clock = clock
        self._recycle_after_calls = recycle_after_calls
        # Places taken: connections out of the pool (in a call, or ready here), and places
        # handed to waiting calls that are taking a connection from the pool.
        self._taken = 0
        self._ready: deque[_Ready] = deque()  # newest last
        self._waiters: deque[asyncio.Future[_Handed]] = deque()  # oldest first
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False

    async def run(self, call: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``call`` on a connection: the most recently kept one, else one from the pool while
        fewer than its size are out, else the first one handed on (or freed) within the
        acquire timeout."""
        ready = await self._take_ready()
        if ready is None and self._taken < self._max_size:
            self._taken += 1
        elif ready is None:
            ready = await self._wait()
        conn, calls = (await self._lend(), 0) if ready is None else (ready.conn, ready.calls)
        try:
            result = await call(conn)
        except BaseException as exc:
            if drops_connection(exc):
                # never handed on, nor reset: the pool replaces it (already given back if it
                # closed meanwhile: nothing left to end)
                with contextlib.suppress(asyncpg.InterfaceError):
                    conn.terminate()
            await self._give_back(conn)
            raise
        await self._keep(conn, calls + 1)
        return result

    @property
    def waiting(self) -> int:
        """Calls waiting for a connection now."""
        return sum(not waiter.done() for waiter in self._waiters)

    def usage(self) -> tuple[int, int, int]:
        """(open, idle, maximum): the ready connections are idle too."""
        idle = self._pool.get_idle_size() + len(self._ready)
        return self._pool.get_size(), idle, self._max_size

    async def give_back_idle(self) -> None:
        """Give the pool every connection that has waited here ``keep_idle_seconds`` or more
        (the oldest are first)."""
        cutoff = self._clock() - self._keep_idle_seconds
        while self._ready and self._ready[0].kept_at <= cutoff:
            await self._give_back(self._ready.popleft().conn)

    async def close(self) -> None:
        """Every ready connection back to the pool, then the pool closed (which waits for the
        calls still running: their connections go back as they end)."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        while self._ready:
            await self._give_back(self._ready.pop().conn)
        await self._pool.close()

    async def _take_ready(self) -> _Ready | None:
        while self._ready:
            ready = self._ready.pop()
            if _reusable(ready.conn):
                return ready
            await self._give_back(ready.conn)  # closed while it waited (the server went away)
        return None

    async def _wait(self) -> _Handed:
        waiter: asyncio.Future[_Handed] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self._acquire_timeout):
                return await waiter
        except BaseException:
            # Handed something in the instant its wait ended (timed out, cancelled): pass it on.
            if waiter.done() and not waiter.cancelled():
                handed = waiter.result()
                if handed is None:
                    self._free_place()
                else:
                    self._hand_on(handed)
            raise
        finally:
            waiter.cancel()  # no-op once done; else the handing on skips it

    async def _lend(self) -> Any:
        """A connection from the pool, for a call that holds a place. With fewer than the pool's
        size out, one is idle there or can be opened: taking it does not wait (a reconnect and
        every statement have their own timeouts), so no acquire timeout (a timer armed and
        cancelled in asyncpg's wait_for) is set."""
        try:
            return await self._pool.acquire(timeout=None)
        except BaseException as exc:
            self._free_place()
            # the pool connected (no statement of opgate's ran): every error is the store's
            if is_unavailable(exc, connecting=True):
                raise StoreUnavailable(f"cannot connect to the database: {exc}") from exc
            raise

    async def _keep(self, conn: Any, calls: int) -> None:
        if self._closing or calls >= self._recycle_after_calls or not _reusable(conn):
            await self._give_back(conn)
            return
        self._hand_on(_Ready(conn, self._clock(), calls))

    def _hand_on(self, ready: _Ready) -> None:
        """To the call waiting longest, else kept ready for the next."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(ready)
                return
        self._ready.append(ready)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _give_back(self, conn: Any) -> None:
        try:
            await self._pool.release(conn)
        finally:
            self._free_place()

    def _free_place(self) -> None:
        """A connection went back to the pool (or none was taken): its place goes to the call
        waiting longest, which takes one from the pool, else it is free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._taken -= 1

    async def _sweep(self) -> None:
        """While connections are ready: every ``keep_idle_seconds``, give back the idle ones."""
        try:
            while self._ready:
                await asyncio.sleep(self._keep_idle_seconds)
                # a connection whose reset failed is terminated by the pool, which opens
                # another when one is next needed: nothing is left to do here
                with contextlib.suppress(Exception):
                    await self.give_back_idle()
        finally:
            self._sweeper = None


def _reusable(conn: Any) -> bool:
    """Open, in no transaction, and still lent: asyncpg takes a lent connection back by itself
    the moment it closes, and its proxy then refuses every call (giving it back again is a
    no-op)."""
    try:
        return not conn.is_closed() and not conn.is_in_transaction()
    except asyncpg.InterfaceError:
        return False
