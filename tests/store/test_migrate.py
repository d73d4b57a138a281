"""Migrations: numbered, applied once, safe when several opgate processes start together."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from proxy.observe.auditlog.chain import GENESIS, record_hash
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
        assert {"operations", "audit_log", "opgate_migrations"} <= tables
    finally:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


def test_migrations_are_numbered_without_gaps() -> None:
    """The shipped migrations are 1..n."""
    numbers = [m.number for m in load_migrations()]
    assert numbers == list(range(1, len(numbers) + 1))


@pytest.mark.parametrize(
    ("operation_id", "record"),
    [
        (None, "{}"),
        ("", '{"a": ""}'),
        ("op-\u00e9\u20ac", '{"note": "caf\u00e9 \u20ac \U0001f600"}'),
    ],
    ids=["null field", "empty field", "multi-byte UTF-8"],
)
async def test_the_plpgsql_record_hash_is_the_verifiers(
    database_url: str, operation_id: str | None, record: str
) -> None:
    """Migration 0004's hash function encodes NULL, empty and multi-byte fields exactly as
    proxy/observe/auditlog/chain.py does, so chains written before and after it verify alike."""
    at = datetime(2026, 11, 29, 9, 30, 1, 123456, tzinfo=UTC)
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetchval("SELECT $1::jsonb::text", record)
        sql_hash = await conn.fetchval(
            "SELECT opgate_audit_hash($1, $2, $3, $4, $5, $6, $7::jsonb)",
            GENESIS, "s\u00e9", 7, at, "transition", operation_id, record,
        )  # fmt: skip
    finally:
        await conn.close()
    assert bytes(sql_hash) == record_hash(
        GENESIS, "s\u00e9", 7, at, "transition", operation_id, stored
    )


async def test_proposal_constraints_hold_in_the_schema(database_url: str) -> None:
    """Migration 0009: a notice is about an operation or a proposal, never both nor neither;
    a proposal's decision time goes with its status; the console knows the approver role."""
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.exceptions.CheckViolationError):
            await conn.execute("INSERT INTO escalation_notifications (kind) VALUES ('escalated')")
        with pytest.raises(asyncpg.exceptions.CheckViolationError):
            await conn.execute(
                "INSERT INTO proposals (proposal_id, operation_id, tenant, agent_id, provider,"
                " action, method, path, idempotency_key, reason, approval_seconds, expires_at,"
                " status) VALUES ('p', 'o', 't', 'a', 'fault', 'r', 'POST', '/', 'k', 'why', 60,"
                " now(), 'approved')"
            )
        await conn.execute(
            "INSERT INTO console_sessions (session_digest, role, identity, csrf_token,"
            " expires_at) VALUES ('d', 'approver', 'olga', 'c', now())"
        )
    finally:
        await conn.close()
