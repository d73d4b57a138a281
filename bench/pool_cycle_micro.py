"""What a store call's connection costs: one-row statements through asyncpg's pool (an acquire
and a release per statement), through the store's Connections (proxy/store/connections.py),
and on one connection held throughout. Client CPU per statement, from getrusage, one
process, one call at a time.

    .venv/bin/python bench/pool_cycle_micro.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

The difference between a row and "held" is what getting and giving back the connection costs.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from proxy.store.connections import Connections
from proxy.store.store import _reset_connection  # the reset the store's pool runs

QUERY = "SELECT $1::text AS a"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(name: str, statements: int, run: Callable[[int], Awaitable[None]]) -> None:
    before = cpu_seconds()
    await run(statements)
    print(f"{name:<28} {(cpu_seconds() - before) / statements * 1e6:7.1f} us CPU per statement")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--statements", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    pool = await asyncpg.create_pool(args.dsn, min_size=10, max_size=10, reset=_reset_connection)
    connections = Connections(pool, acquire_timeout=5.0)

    async def through_the_pool(n: int) -> None:
        for _ in range(n):
            async with pool.acquire() as conn:
                await conn.fetchrow(QUERY, "x")

    async def through_connections(n: int) -> None:
        async def one(conn: Any) -> Any:
            return await conn.fetchrow(QUERY, "x")

        for _ in range(n):
            await connections.run(one)

    async def held(n: int) -> None:
        async with pool.acquire() as conn:
            for _ in range(n):
                await conn.fetchrow(QUERY, "x")

    try:
        for _ in range(args.rounds):
            await measure("asyncpg pool per statement", args.statements, through_the_pool)
            await measure("store Connections", args.statements, through_connections)
            await measure("one connection held", args.statements, held)
    finally:
        await connections.close()


if __name__ == "__main__":
    asyncio.run(main())
