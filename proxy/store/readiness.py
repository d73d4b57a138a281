"""``/readyz``'s own database connection, outside the pool, under a deadline.

Readiness must answer within a probe's timeout (Kubernetes: 1 s by default) whatever holds the
pool: measured, it answered 503 after 2.35-2.56 s when a synchronous standby died and after
7.25 s when sends held every pooled connection (it waited for one, then for its heartbeat
commit). A probe that times out is not an answer. So readiness runs its statements on one
connection of its own, made and kept here, and the whole check (waiting for the previous
check, connecting, every statement) is bounded by the budget; past it, the connection is
terminated, so that the next check connects anew (to the new primary after a failover), and
the caller answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

T = TypeVar("T")

__all__ = ["ReadinessConnection"]


class ReadinessConnection:
    """One connection for readiness checks, one check at a time."""

    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]]) -> None:
        self._connect = connect
        self._conn: asyncpg.Connection | None = None
        self._turn = asyncio.Lock()

    async def run(self, call: Callable[[asyncpg.Connection], Awaitable[T]], budget: float) -> T:
        """``call`` on the readiness connection, connecting first if there is none; raises
        TimeoutError if the whole of it (a check still running included) takes longer than
        ``budget`` seconds. On any error the connection is dropped."""
        async with asyncio.timeout(budget), self._turn:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await self._connect()
                return await call(self._conn)
            except BaseException:
                self.drop()
                raise

    def drop(self) -> None:
        """Terminate the connection (a statement cut short leaves it in no known state)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.terminate()
