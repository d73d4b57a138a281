"""Migration 0020 (one record per transition) on a database that holds chains written before
it: the events read the same, every chain goes on and verifies, and tampering is still named."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog import records
from proxy.observe.auditlog.verify import VerifyReport, verify
from proxy.store import queries
from proxy.store.migrate import migrate
from tests.support import before_0020
from tests.support.auditlog import AUDIT_KEY, run_cli
from tests.support.postgres import database_at_migration
from tests.support.tamper import rechain

BEGINNING, END = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)
KEY = AUDIT_KEY.encode()
REQUESTS = "requests/instance-a"
_EVENTS = (
    "SELECT event_id, operation_id, at, event, from_status, to_status, actor, detail::text"
    " FROM operation_events ORDER BY event_id"
)


@pytest_asyncio.fixture(loop_scope="session")
async def at_0019(pg_server_dsn: str) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A database at migration 0019 (the last before the change), its DSN and a connection;
    dropped afterwards."""
    name = f"opgate_m0020_{uuid.uuid4().hex[:12]}"
    dsn = await database_at_migration(pg_server_dsn, name, 19)
    conn = await asyncpg.connect(dsn)
    try:
        yield dsn, conn
    finally:
        await conn.close()
        admin = await asyncpg.connect(pg_server_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def _requests(first: int, count: int) -> list[dict[str, Any]]:
    return [
        {"record_type": "request", "instance_seq": n, "operation_id": None}
        for n in range(first, first + count)
    ]


async def _whole(conn: asyncpg.Connection) -> VerifyReport:
    return await verify(conn, BEGINNING, END, key=KEY, whole_log=True)


async def _create(conn: asyncpg.Connection, operation_id: str) -> None:
    created = await queries.fetchrow(
        conn, "create_operation",
        operation_id=operation_id, tenant="t", agent_id="agent", provider="fault",
        action="refund", method="POST", path="/v1/refunds", path_params="{}", amount=500,
        currency="usd", params="{}", idempotency_key=f"key-{operation_id}", approval_ref="ref",
        approved_by="human", expires_at=datetime.now(UTC) + timedelta(hours=1), actor="test",
        supersedes=None,
    )  # fmt: skip
    assert created is not None


async def _claim(conn: asyncpg.Connection, operation_id: str, expected_attempts: int) -> None:
    claimed = await queries.fetchrow(
        conn, "claim_operation",
        operation_id=operation_id, owner="me", lease_seconds=30.0,
        expected_attempts=expected_attempts, actor=None, dedup_window_seconds=None,
        after_lookup_by=None,
        read_version=None, decided_before=None,
    )  # fmt: skip
    assert claimed is not None


async def _settle(conn: asyncpg.Connection, operation_id: str) -> None:
    settled = await queries.fetchrow(
        conn, "settle_operation",
        operation_id=operation_id, status="confirmed", provider_status=200, object_id="re_1",
        content_type="application/json", body=b"{}", actor="me", request=None,
    )  # fmt: skip
    assert settled is not None


async def _old_chains(conn: asyncpg.Connection) -> None:
    """At 0019: operations through the old event rows, request records (a small batch by the
    trigger, a large one by the batch function), a policy load, and an HMAC checkpoint that
    signs part of it (what moves after it stays unsigned until the migration)."""
    await records.record_policy_event(
        conn, "instance-a", {"record_type": "policy_load", "policy_version": "v1"},
        now_deciding=True,
    )  # fmt: skip
    for operation_id in ("op_signed", "op_unsigned", "op_settled_after"):
        await before_0020.create(conn, operation_id)
        await before_0020.claim(conn, operation_id)
    await records.append_batch(conn, REQUESTS, "request", _requests(1, 2))
    await before_0020.checkpoint(conn, KEY, "writer-a")
    await before_0020.release(conn, "op_unsigned")
    await records.append_batch(conn, REQUESTS, "request", _requests(3, records.MANY_RECORDS))
    # an event row whose audit record is gone (as a prune leaves it): kept by the migration
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(
            "INSERT INTO operation_events (operation_id, event, from_status, to_status, actor,"
            " detail) VALUES ('op_signed', 'note', 'dispatched', 'dispatched', 'admin', '{}')"
        )


async def test_old_chains_go_on_and_verify_after_migration_0020(
    at_0019: tuple[str, asyncpg.Connection],
) -> None:
    """Chains written at 0019 (transitions, requests, a policy load, a checkpoint), migrated:
    every event row reads the same through the view, each operation's head moves onto its
    row (a reviewer role of before may read it), new transitions continue the old chains, the
    next checkpoint signs what moved, and the whole log verifies with the key (`opgate audit
    verify` too)."""
    dsn, conn = at_0019
    await _old_chains(conn)
    events_before = [tuple(r) for r in await conn.fetch(_EVENTS)]
    heads_before = {
        r["stream"]: (r["seq"], bytes(r["hash"]))
        for r in await conn.fetch("SELECT stream, seq, hash FROM audit_heads")
    }
    records_before = await conn.fetchval("SELECT count(*) FROM audit_log")
    assert len(events_before) == 3 * 2 + 1 + 1

    reviewer = f"opgate_reviewer_{uuid.uuid4().hex[:8]}"
    await conn.execute(f'CREATE ROLE "{reviewer}"')
    try:
        await conn.execute(f'GRANT SELECT ON audit_heads TO "{reviewer}"')
        applied = await migrate(dsn)  # 0020 and every later migration
        assert applied[0] == 20
        # a reviewer of before reads every head through the view
        granted = "SELECT has_table_privilege($1, 'audit_stream_heads', 'SELECT')"
        assert await conn.fetchval(granted, reviewer)
    finally:
        await conn.execute(f'DROP OWNED BY "{reviewer}"')
        await conn.execute(f'DROP ROLE "{reviewer}"')

    assert [tuple(r) for r in await conn.fetch(_EVENTS)] == events_before
    assert await conn.fetchval("SELECT count(*) FROM audit_log") == records_before
    assert await conn.fetchval("SELECT count(*) FROM operation_events_unchained") == 1
    on_rows = {
        r["operation_id"]: (r["audit_seq"], bytes(r["audit_hash"]))
        for r in await conn.fetch("SELECT operation_id, audit_seq, audit_hash FROM operations")
    }
    assert on_rows == {s: heads_before[s] for s in ("op_signed", "op_unsigned", "op_settled_after")}
    # the signed heads left audit_heads; the unsigned one waits there for the next checkpoint
    left = {r["stream"] for r in await conn.fetch("SELECT stream FROM audit_heads")}
    assert left == {"op_unsigned", REQUESTS, records.STREAM_POLICY}
    report = await _whole(conn)
    assert report.ok, [b.describe() for b in report.breaks]

    await _settle(conn, "op_settled_after")
    await _create(conn, "op_new")
    await _claim(conn, "op_new", 0)
    await _settle(conn, "op_new")
    await records.append_batch(conn, REQUESTS, "request", _requests(3 + records.MANY_RECORDS, 1))
    await records.record_policy_event(
        conn, "instance-a", {"record_type": "policy_load", "policy_version": "v2"},
        now_deciding=True,
    )  # fmt: skip
    checkpoint = await records.write_checkpoint(conn, KEY, "writer-a")
    assert checkpoint is not None
    signed = json.loads(
        await conn.fetchval(
            "SELECT heads::text FROM audit_checkpoints WHERE checkpoint_id = $1", checkpoint[0]
        )
    )
    assert {(s, q) for s, q, _ in signed} == {
        ("op_unsigned", 3),
        ("op_settled_after", 3),
        ("op_new", 3),
        (REQUESTS, 3 + records.MANY_RECORDS),
        (records.STREAM_POLICY, 2),
    }
    assert await conn.fetchval("SELECT count(*) FROM audit_heads WHERE stream LIKE 'op_%'") == 0
    assert await records.write_checkpoint(conn, KEY, "writer-a") is None  # nothing moved since

    events = await conn.fetch(
        "SELECT event, from_status, to_status FROM operation_events"
        " WHERE operation_id = 'op_settled_after' ORDER BY event_id"
    )
    assert [tuple(e) for e in events] == [
        ("created", None, "created"),
        ("claimed", "created", "dispatched"),
        ("confirmed", "dispatched", "confirmed"),
    ]
    report = await _whole(conn)
    assert report.ok, [b.describe() for b in report.breaks]
    assert report.records == records_before + 3 + 1 + 1 + 1
    assert report.checkpoints_authenticated
    env = {"OPGATE_SECRET_AUDIT_KEY": AUDIT_KEY, "PATH": "/usr/bin:/bin"}
    code, out = await run_cli("audit", "verify", "--database-url", dsn, env=env)
    assert code == 0, out
    assert "signatures verified" in out


async def test_a_rewritten_transition_is_named_before_and_after_the_migration(
    at_0019: tuple[str, asyncpg.Connection],
) -> None:
    """After 0020, an edited record (one written before the migration, one after) is named
    where it is; a stream re-hashed with its head on the operation row moved to match is
    caught by the checkpoints that signed the old heads (one before the migration, one
    after)."""
    dsn, conn = at_0019
    await _old_chains(conn)
    await migrate(dsn)
    await _settle(conn, "op_settled_after")
    assert await records.write_checkpoint(conn, KEY, "writer-a") is not None
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(
            "UPDATE audit_log SET record = jsonb_set(record, '{actor}', '\"someone-else\"')"
            " WHERE stream = 'op_settled_after' AND seq IN (2, 3)"
        )
    named = [(b.stream, b.seq) for b in (await _whole(conn)).breaks]
    assert named == [("op_settled_after", 2), ("op_settled_after", 3)]

    await rechain(conn, "op_settled_after")  # every hash recomputed, the row's head moved too
    breaks = (await _whole(conn)).breaks
    assert [(b.stream, b.seq) for b in breaks] == [("op_settled_after", 2), ("op_settled_after", 3)]
    assert all("differs from the hash checkpoint" in b.problem for b in breaks)


async def test_a_tail_deleted_around_the_row_head_is_named(
    at_0019: tuple[str, asyncpg.Connection],
) -> None:
    """A transition record deleted at the end of its stream (the head on the operation row
    left as it was) is named by verify's heads check, without any checkpoint."""
    dsn, conn = at_0019
    await migrate(dsn)
    await _create(conn, "op_cut")
    await _claim(conn, "op_cut", 0)
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute("DELETE FROM audit_log WHERE stream = 'op_cut' AND seq = 2")
    breaks = (await verify(conn, BEGINNING, END, key=None, whole_log=True)).breaks
    assert [(b.stream, b.seq) for b in breaks] == [("op_cut", 2)]
    assert "appended around the chain" in breaks[0].problem
