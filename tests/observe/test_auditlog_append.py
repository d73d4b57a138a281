"""Appending to the audit chains in the database (migration 0010): a larger batch is chained
record by record with one head update, batches racing on one stream chain in commit order,
chains written before 0010 go on after it, and what is written around the chain is found."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog import records
from proxy.observe.auditlog.chain import GENESIS, record_hash
from proxy.observe.auditlog.records import MANY_RECORDS
from proxy.observe.auditlog.verify import VerifyReport, verify
from proxy.store import queries
from proxy.store.migrate import migrate
from tests.support import before_0020
from tests.support.postgres import database_at_migration

BEGINNING, END = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)
STREAM = "requests/test-instance"
# How records were appended until migration 0010 (and how a hand-written INSERT still is):
# seq 0, chained by audit_log's trigger, one head update per row.
_APPEND_BEFORE_0010 = (
    "INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)"
    " SELECT $1, 0, $2, r.value ->> 'operation_id', r.value, '\\x', '\\x'"
    "   FROM jsonb_array_elements($3::jsonb) WITH ORDINALITY AS r (value, position)"
    "  ORDER BY r.position"
)


def _requests(first: int, count: int) -> list[dict[str, object]]:
    return [{"record_type": "request", "instance_seq": n} for n in range(first, first + count)]


async def _whole(conn: asyncpg.Connection) -> VerifyReport:
    return await verify(conn, BEGINNING, END, key=None, whole_log=True)


async def _chain(conn: asyncpg.Connection, stream: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT seq, at, kind, operation_id, record::text AS record, prev_hash, hash"
        " FROM audit_log WHERE stream = $1 ORDER BY seq",
        stream,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def test_a_batch_is_chained_record_by_record_and_its_head_moved_once(
    conn: asyncpg.Connection,
) -> None:
    """A large batch on a new stream, a small one (the trigger's), a large one: seq 1..n in
    order, each record hashed onto the one before it exactly as the verifier recomputes it,
    the head at the last record, and verify clean."""
    sizes = [MANY_RECORDS + 2, 3, MANY_RECORDS]
    first = 1
    for size in sizes:
        await records.append_batch(conn, STREAM, "request", _requests(first, size))
        first += size
    total = sum(sizes)
    rows = await _chain(conn, STREAM)
    assert [r["seq"] for r in rows] == list(range(1, total + 1))
    assert [json.loads(r["record"])["instance_seq"] for r in rows] == list(range(1, total + 1))
    prev = GENESIS
    for r in rows:
        assert bytes(r["prev_hash"]) == prev
        expected = record_hash(
            prev, STREAM, r["seq"], r["at"], r["kind"], r["operation_id"], r["record"]
        )
        assert bytes(r["hash"]) == expected
        prev = expected
    head = await conn.fetchrow(
        "SELECT seq, prev_hash, hash FROM audit_heads WHERE stream = $1", STREAM
    )
    assert (head["seq"], bytes(head["hash"]), bytes(head["prev_hash"])) == (
        total,
        bytes(rows[-1]["hash"]),
        bytes(rows[-2]["hash"]),
    )
    report = await _whole(conn)
    assert report.ok, [b.describe() for b in report.breaks]


async def test_an_empty_batch_appends_nothing_and_leaves_no_head(
    conn: asyncpg.Connection,
) -> None:
    """An empty batch on a new stream writes no record and no head (a head at 0 with no
    record would read as a deleted tail)."""
    await queries.execute(conn, "audit_append_many", stream=STREAM, kind="request", records="[]")
    assert await conn.fetchval("SELECT count(*) FROM audit_heads WHERE stream = $1", STREAM) == 0
    assert (await _whole(conn)).ok


async def test_batches_racing_on_one_new_stream_chain_in_commit_order(database_url: str) -> None:
    """Eight connections appending batches to one stream at once (large ones, chained by the
    function, and small ones, by the trigger), its first records included: every record is
    stored once, numbered without gaps, and the chain verifies."""
    connections = [await asyncpg.connect(database_url) for _ in range(8)]
    try:
        per_writer = 5 * (MANY_RECORDS + 2)

        async def writer(index: int, connection: asyncpg.Connection) -> None:
            first = index * per_writer + 1
            for size in [MANY_RECORDS, 2] * 5:
                await records.append_batch(connection, STREAM, "request", _requests(first, size))
                first += size

        await asyncio.gather(*(writer(i, c) for i, c in enumerate(connections)))
        rows = await _chain(connections[0], STREAM)
        assert [r["seq"] for r in rows] == list(range(1, 8 * per_writer + 1))
        numbers = sorted(json.loads(r["record"])["instance_seq"] for r in rows)
        assert numbers == list(range(1, 8 * per_writer + 1))
        report = await _whole(connections[0])
        assert report.ok, [b.describe() for b in report.breaks]
    finally:
        for connection in connections:
            await connection.close()


async def test_a_record_inserted_with_a_seq_of_its_own_is_found(conn: asyncpg.Connection) -> None:
    """A row inserted with its own seq skips the chaining trigger; even hashed correctly onto
    the last record (no key is needed), verify names the stream, whose head it went around."""
    await records.append_batch(conn, STREAM, "request", _requests(1, MANY_RECORDS))
    last = (await _chain(conn, STREAM))[-1]
    seq = MANY_RECORDS + 1
    forged = json.dumps({"record_type": "request", "instance_seq": seq})
    at = datetime.now(UTC)
    stored = await conn.fetchval("SELECT $1::jsonb::text", forged)
    await conn.execute(
        "INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)"
        " VALUES ($1, $2, $3, 'request', NULL, $4::jsonb, $5, $6)",
        STREAM,
        seq,
        at,
        forged,
        bytes(last["hash"]),
        record_hash(bytes(last["hash"]), STREAM, seq, at, "request", None, stored),
    )
    report = await _whole(conn)
    assert [(b.stream, b.seq) for b in report.breaks] == [(STREAM, MANY_RECORDS)]
    assert "appended around the chain" in report.breaks[0].problem


async def test_a_batch_record_edited_afterwards_is_named(conn: asyncpg.Connection) -> None:
    """Editing a record a batch appended breaks its hash: verify names that record."""
    await records.append_batch(conn, STREAM, "request", _requests(1, MANY_RECORDS))
    await conn.execute(
        "UPDATE audit_log SET record = jsonb_set(record, '{instance_seq}', '99')"
        " WHERE stream = $1 AND seq = 2",
        STREAM,
    )
    first = (await _whole(conn)).first_break()
    assert first is not None
    assert (first.stream, first.seq) == (STREAM, 2)
    assert "does not match its hash" in first.problem


async def _transition(conn: asyncpg.Connection, operation_id: str, *, migrated: bool) -> None:
    """A created operation (its first transition record), then its claim (the second); both
    as the schema of migration 0009 takes them unless ``migrated`` (to the latest)."""
    if not migrated:
        await before_0020.create(conn, operation_id)
        await before_0020.claim(conn, operation_id)
        return
    expires = datetime.now(UTC) + timedelta(hours=1)
    created = await queries.fetchrow(
        conn, "create_operation",
        operation_id=operation_id, tenant="t", agent_id="agent", provider="fault",
        action="refund", method="POST", path="/v1/refunds", path_params="{}", amount=500,
        currency="usd", params="{}", idempotency_key=f"key-{operation_id}", approval_ref="ref",
        approved_by="human", expires_at=expires, actor="test", supersedes=None,
    )  # fmt: skip
    assert created is not None
    claimed = await queries.fetchrow(
        conn, "claim_operation",
        operation_id=operation_id, owner="me", lease_seconds=30.0, expected_attempts=0,
        actor=None, dedup_window_seconds=None, after_lookup_by=None,
        read_version=None, decided_before=None,
    )  # fmt: skip
    assert claimed is not None


async def test_chains_written_before_migration_0010_go_on_after_it(pg_server_dsn: str) -> None:
    """Records chained by 0009's trigger, then the migration, then records chained by 0010's
    function and by the trigger: one chain per stream, numbered on, that verifies, and an
    edit of a record written before the migration is still named."""
    name = f"opgate_append_{uuid.uuid4().hex[:12]}"
    dsn = await database_at_migration(pg_server_dsn, name, 9)
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(_APPEND_BEFORE_0010, STREAM, "request", json.dumps(_requests(1, 3)))
            await _transition(conn, "op_before", migrated=False)
            assert (await migrate(dsn))[0] == 10  # and any after it
            await records.append_batch(conn, STREAM, "request", _requests(4, MANY_RECORDS))
            await _transition(conn, "op_after", migrated=True)
            # a hand-written seq 0 INSERT is still chained by the trigger
            await conn.execute(
                _APPEND_BEFORE_0010, STREAM, "request", json.dumps(_requests(4 + MANY_RECORDS, 1))
            )
            await queries.fetchrow(
                conn, "settle_operation",
                operation_id="op_before", status="confirmed", provider_status=200,
                object_id="re_1", content_type="application/json", body=b"{}", actor="me",
                request=None,
            )  # fmt: skip
            requests = await _chain(conn, STREAM)
            count = 3 + MANY_RECORDS + 1
            assert [json.loads(r["record"])["instance_seq"] for r in requests] == list(
                range(1, count + 1)
            )
            assert [r["seq"] for r in requests] == list(range(1, count + 1))
            assert [r["seq"] for r in await _chain(conn, "op_before")] == [1, 2, 3]
            report = await _whole(conn)
            assert report.ok, [b.describe() for b in report.breaks]
            assert report.records == count + 3 + 2
            await conn.execute(
                "UPDATE audit_log SET record = jsonb_set(record, '{actor}', '\"x\"')"
                " WHERE stream = 'op_before' AND seq = 2"
            )
            first = (await _whole(conn)).first_break()
            assert first is not None
            assert (first.stream, first.seq) == ("op_before", 2)
        finally:
            await conn.close()
    finally:
        admin = await asyncpg.connect(pg_server_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
