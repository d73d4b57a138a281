"""Migrations: numbered, applied once, safe when several opgate processes start together."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from proxy.store.migrate import load_migrations, migrate
from tests.support.postgres import dsn_for_database


async def test_concurrent_start_ups_apply_each_migration_once(pg_server_dsn: str) -> None:
    """Five migrators racing on an empty database: no error, each migration applied once."""
    conn = await asyncpg.connect(pg_server_dsn)
    name = f"opgate_migrate_{uuid.uuid4().hex[:12]}"
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.execute(f'CREATE DATABASE "{name}"')
    try:
        dsn = dsn_for_database(pg_server_dsn, name)
        applied = await asyncio.gather(*(migrate(dsn) for _ in range(5)))
        assert sorted(n for run in applied for n in run) == [m.number for m in load_migrations()]
        assert await migrate(dsn) == []
        check = await asyncpg.connect(dsn)
        try:
            tables = {r["tablename"] for r in await check.fetch("SELECT tablename FROM pg_tables")}
        finally:
            await check.close()
        assert {"operations", "operation_events", "opgate_migrations"} <= tables
    finally:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


def test_migrations_are_numbered_without_gaps() -> None:
    """The shipped migrations are 1..n."""
    numbers = [m.number for m in load_migrations()]
    assert numbers == list(range(1, len(numbers) + 1))
