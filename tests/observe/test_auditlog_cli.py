"""``opgate audit show`` run as a user runs it (a subprocess) on a real database whose audit
log was written by real traffic and then tampered with by direct SQL, as a superuser would."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog.chain import record_hash
from tests.support.auditlog import run_cli
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import StartOpgate, fault_policy


@pytest_asyncio.fixture(loop_scope="session")
async def operation_id(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> AsyncIterator[str]:
    """One operation approved, sent and confirmed, with a second approved after it."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        status, _, _ = await gate.send(
            "/fault/v1/refunds",
            data="amount=500&currency=usd&charge=ch_1",
            headers={"X-Operation-Id": op["operation_id"]},
        )
        assert status == 200
        await gate.approve()
    yield op["operation_id"]


async def show(database_url: str, operation_id: str) -> tuple[int, dict[tuple[str, str], str]]:
    """`opgate audit show`'s exit code, and its chain column by (kind, event)."""
    env = {**os.environ, "OPGATE_DATABASE_URL": database_url}
    code, out = await run_cli("audit", "show", operation_id, env=env)
    lines = out.splitlines()
    header = lines[1].split()
    assert header[0] == "chain", out
    rows = [line.split() for line in lines[3:] if line and not line.startswith(" ")]
    rows = [row for row in rows if row[0] in {"ok", "BROKEN"}]
    return code, {(row[2], row[3]): row[0] for row in rows}


async def _untriggered(conn: asyncpg.Connection, sql: str, *args: object) -> None:
    """A superuser's edit, around the chaining trigger."""
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(sql, *args)


async def test_show_marks_exactly_the_records_that_do_not_verify(
    operation_id: str, database_url: str
) -> None:
    """An untouched timeline is all `ok`; an edited record is BROKEN (its hash), and after an
    edit whose hash was recomputed, the record after it is BROKEN (its link), nothing else."""
    code, chain = await show(database_url, operation_id)
    assert code == 0
    assert set(chain.values()) == {"ok"}, chain
    conn = await asyncpg.connect(database_url)
    try:
        created = await conn.fetchrow(
            "SELECT stream, seq FROM audit_log WHERE operation_id = $1"
            " AND record->>'event' = 'created'",
            operation_id,
        )
        await _untriggered(
            conn,
            "UPDATE audit_log SET record = jsonb_set(record, '{actor}', '\"mallory\"')"
            " WHERE stream = $1 AND seq = $2",
            created["stream"],
            created["seq"],
        )
        code, chain = await show(database_url, operation_id)
        assert code == 1
        assert [k for k, v in chain.items() if v == "BROKEN"] == [("transition", "created")]

        # the edit made whole: its hash recomputed, so the record after it no longer links
        row = await conn.fetchrow(
            "SELECT stream, seq, at, kind, operation_id, record::text AS record, prev_hash"
            " FROM audit_log WHERE stream = $1 AND seq = $2",
            created["stream"],
            created["seq"],
        )
        rehashed = record_hash(
            bytes(row["prev_hash"]),
            row["stream"],
            row["seq"],
            row["at"],
            row["kind"],
            row["operation_id"],
            row["record"],
        )
        await _untriggered(
            conn,
            "UPDATE audit_log SET hash = $3 WHERE stream = $1 AND seq = $2",
            created["stream"],
            created["seq"],
            rehashed,
        )
        following = await conn.fetchrow(
            "SELECT kind, record->>'event' AS event FROM audit_log WHERE stream = $1 AND seq = $2",
            created["stream"],
            created["seq"] + 1,
        )
    finally:
        await conn.close()
    code, chain = await show(database_url, operation_id)
    assert code == 1
    assert [k for k, v in chain.items() if v == "BROKEN"] == [
        (following["kind"], following["event"])
    ]
