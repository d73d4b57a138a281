"""Numbered schema migrations, applied once, safely under concurrent start-ups.

Each file in ``migrations/`` is ``NNNN_name.sql``. They run in order inside one transaction that
first takes a transaction-scoped advisory lock, so two opgate processes starting together
serialize here and the second one finds nothing left to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from proxy.errors import StoreUnavailable
from proxy.store.faults import is_unavailable

# Any constant works; it only has to be the same in every opgate process.
_MIGRATION_LOCK_KEY = 0x6F70_6761_7465  # "opgate"
_FILE_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    number: int
    name: str
    sql: str


def load_migrations() -> list[Migration]:
    """Every shipped migration, in order; refuses gaps and duplicates."""
    found: list[Migration] = []
    folder = resources.files("proxy.store") / "migrations"
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort(key=lambda m: m.number)
    expected = list(range(1, len(found) + 1))
    if [m.number for m in found] != expected:
        raise RuntimeError(
            f"migrations must be numbered 1..n without gaps: {[m.name for m in found]}"
        )
    return found


async def migrate(dsn: str) -> list[int]:
    """Apply the migrations the database lacks; returns the numbers applied by this call.
    StoreUnavailable when the database cannot be reached or used (faults.py)."""
    try:
        conn = await asyncpg.connect(dsn)
    except Exception as exc:
        if is_unavailable(exc, connecting=True):
            raise StoreUnavailable(f"cannot connect: {exc}") from exc
        raise
    try:
        return await migrate_connection(conn)
    except Exception as exc:
        if is_unavailable(exc):
            raise StoreUnavailable(f"cannot migrate: {exc}") from exc
        raise
    finally:
        await conn.close()


async def migrate_connection(conn: asyncpg.Connection) -> list[int]:
    applied_now: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK_KEY)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS opgate_migrations ("
            " number integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row["number"] for row in await conn.fetch("SELECT number FROM opgate_migrations")}
        for migration in load_migrations():
            if migration.number in done:
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO opgate_migrations (number, name) VALUES ($1, $2)",
                migration.number,
                migration.name,
            )
            applied_now.append(migration.number)
    return applied_now
