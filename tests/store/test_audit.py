"""The audit log's statements (proxy/store/audit.py), each run against a real PostgreSQL: what
one appends, another reads back."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest_asyncio

from proxy.store import audit, queries
from tests.support.polling import until

BEGINNING, END = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)
STREAM = "requests/store-test"


def _texts(first: int, count: int, operation_id: str | None = None) -> list[str]:
    return [
        json.dumps({"record_type": "request", "instance_seq": n, "operation_id": operation_id})
        for n in range(first, first + count)
    ]


def _run(numbered: int, stored: int, *, stopped: bool = False) -> dict[str, object]:
    return {
        "run_id": "run-1",
        "instance_id": "store-test",
        "stream": STREAM,
        "numbered_seq": numbered,
        "stored_seq": stored,
        "heartbeat_seconds": 5.0,
        "stopped": stopped,
    }


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def test_appended_records_are_read_back_by_every_reader(conn: asyncpg.Connection) -> None:
    """A small batch, a large one and a request batch land chained in one stream, and the
    readers (between, after, at, by operation, heads, numbering) all see them."""
    await audit.append_texts(conn, STREAM, "request", _texts(1, 2, "op_a"))
    await audit.append_texts(conn, STREAM, "request", _texts(3, audit.MANY_RECORDS))
    await audit.append_requests(conn, STREAM, _texts(3 + audit.MANY_RECORDS, 1), _run(11, 11))
    total = 3 + audit.MANY_RECORDS

    async with conn.transaction(isolation="repeatable_read", readonly=True):
        between = [row async for row in audit.records_between(conn, BEGINNING, END)]
    assert [(r["stream"], r["seq"]) for r in between] == [(STREAM, n) for n in range(1, total + 1)]
    assert between[0]["predecessor_hash"] is None
    assert bytes(between[1]["predecessor_hash"]) == bytes(between[0]["hash"])

    after = await audit.records_after(conn, {STREAM: 2}, 3)
    assert [r["seq"] for r in after] == [3, 4, 5]
    at = await audit.records_at(conn, [(STREAM, 1), (STREAM, 99)])
    assert {(r["stream"], r["seq"]): r["hash"] is not None for r in at} == {
        (STREAM, 1): True,
        (STREAM, 99): False,
    }
    assert [r["seq"] for r in await audit.operation_records(conn, "op_a")] == [1, 2]
    assert await audit.heads_mismatched(conn) == []
    assert await audit.request_numbering(conn, {}) == []
    assert await audit.runs_unaccounted(conn, 3.0) != []  # running: not stopped yet
    await audit.run_seen(conn, _run(11, 11, stopped=True))
    assert await audit.runs_unaccounted(conn, 3.0) == []


async def test_a_checkpoint_takes_the_moved_heads_once(conn: asyncpg.Connection) -> None:
    """The heads that moved are taken once; the checkpoint inserted is the last one and is
    listed with every other."""
    await audit.append_texts(conn, STREAM, "request", _texts(1, 2))
    async with conn.transaction():
        await audit.lock_checkpoints(conn)
        heads = await audit.take_changed_heads(conn)
        assert [(h["stream"], h["seq"]) for h in heads] == [(STREAM, 2)]
        assert await audit.last_checkpoint(conn) is None
        heads_json = json.dumps([[STREAM, 2, bytes(heads[0]["hash"]).hex()]])
        checkpoint_id = await audit.insert_checkpoint(
            conn, datetime.now(UTC), "test", heads_json, bytes(32), b"m" * 32
        )
    async with conn.transaction():
        assert await audit.take_changed_heads(conn) == []
    last = await audit.last_checkpoint(conn)
    assert last is not None
    assert last["checkpoint_id"] == checkpoint_id
    assert [c["checkpoint_id"] for c in await audit.checkpoints(conn)] == [checkpoint_id]


async def test_a_prune_deletes_what_prunable_listed(conn: asyncpg.Connection) -> None:
    """The records at or before a cut are listed, then deleted (their count returned), and
    the retention stream's record is read back."""
    await audit.append_texts(conn, STREAM, "request", _texts(1, 3))
    async with conn.transaction():
        listed = [(r["stream"], r["seq"]) async for r in audit.prunable(conn, [(STREAM, 2)])]
        await audit.append_texts(conn, "retention", "retention", [json.dumps({"event": "pruned"})])
        assert await audit.prune(conn, [(STREAM, 2)]) == 2
    assert listed == [(STREAM, 1), (STREAM, 2)]
    assert [json.loads(t) for t in await audit.retention_records(conn)] == [{"event": "pruned"}]
    assert [r["seq"] for r in await audit.records_after(conn, {}, 10) if r["stream"] == STREAM] == [
        3
    ]


async def test_the_instance_policy_is_set_then_replaced(conn: asyncpg.Connection) -> None:
    """The instance's policy version is inserted, then replaced."""
    await audit.set_instance_policy(conn, "store-test", "v1")
    await audit.set_instance_policy(conn, "store-test", "v2")
    version = await conn.fetchval(
        "SELECT policy_version FROM audit_instances WHERE instance_id = 'store-test'"
    )
    assert version == "v2"


async def test_the_reviewer_grants_apply_to_a_role(conn: asyncpg.Connection) -> None:
    """The reviewer's statements name the role quoted, and applied they let it read the log."""
    role = f"reviewer {uuid.uuid4().hex[:8]}"  # a space: only a quoted name survives
    await conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        statements = await audit.reviewer_grants(conn, role)
        assert len(statements) == 2
        assert all(f'"{role}"' in s for s in statements)
        await audit.grant(conn, statements)
        assert await conn.fetchval("SELECT has_table_privilege($1, 'audit_log', 'SELECT')", role)
        assert not await conn.fetchval(
            "SELECT has_table_privilege($1, 'operations', 'SELECT')", role
        )
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE "{role}"')


async def _create(conn: asyncpg.Connection, operation_id: str) -> asyncpg.Record | None:
    return await queries.fetchrow(
        conn, "create_operation",
        operation_id=operation_id, tenant="t", agent_id=None, provider="fault",
        action="refund", method="POST", path="/v1/refunds", path_params="{}", amount=1,
        currency="usd", params="{}", idempotency_key=f"key-{operation_id}",
        approval_ref="ref", approved_by="human", expires_at=datetime(9999, 1, 1, tzinfo=UTC),
        actor="test", supersedes=None,
    )  # fmt: skip


async def _claim(conn: asyncpg.Connection, operation_id: str) -> None:
    claimed = await queries.fetchrow(
        conn, "claim_operation",
        operation_id=operation_id, owner="me", lease_seconds=30.0, expected_attempts=0,
        actor=None, dedup_window_seconds=None, after_lookup_by=None,
        read_version=None, decided_before=None,
    )  # fmt: skip
    assert claimed is not None


async def _taken_heads(conn: asyncpg.Connection) -> list[tuple[str, int]]:
    async with conn.transaction():
        await audit.lock_checkpoints(conn)
        return [(r["stream"], r["seq"]) for r in await audit.take_changed_heads(conn)]


async def test_a_transition_writes_one_record_and_moves_its_head_on_the_operation_row(
    conn: asyncpg.Connection,
) -> None:
    """Creation, claim and settlement each write exactly one audit record (nothing else: no
    event row, no audit_heads row), chained onto the head kept on the operation row."""
    assert await _create(conn, "op_one") is not None
    assert await _create(conn, "op_one") is None  # a repeated creation writes nothing
    await _claim(conn, "op_one")
    await queries.fetchrow(
        conn, "settle_operation",
        operation_id="op_one", status="confirmed", provider_status=200, object_id="re_1",
        content_type="application/json", body=b"{}", actor="me", request=None,
    )  # fmt: skip
    rows = await conn.fetch("SELECT stream, seq, hash FROM audit_log ORDER BY seq")
    assert [(r["stream"], r["seq"]) for r in rows] == [("op_one", 1), ("op_one", 2), ("op_one", 3)]
    head = await conn.fetchrow("SELECT audit_seq, audit_hash FROM operations")
    assert (head["audit_seq"], bytes(head["audit_hash"])) == (3, bytes(rows[-1]["hash"]))
    assert await conn.fetchval("SELECT count(*) FROM audit_heads") == 0
    kind = await conn.fetchval(
        "SELECT relkind::text FROM pg_class WHERE relname = 'operation_events'"
    )
    assert kind == "v"  # a view over the transition records


async def test_the_checkpointer_takes_an_operation_head_once_its_record_is_visible(
    conn: asyncpg.Connection, database_url: str
) -> None:
    """An operation's head is taken by the first checkpoint that sees its new record: not while
    the transition's transaction is open (it may still commit), then after its commit, and
    never again until it moves."""
    await _create(conn, "op_late")
    assert await _taken_heads(conn) == [("op_late", 1)]
    other = await asyncpg.connect(database_url)
    try:
        open_transition = other.transaction()
        await open_transition.start()
        await _claim(other, "op_late")
        assert await _taken_heads(conn) == []
        await open_transition.commit()
    finally:
        await other.close()
    assert await _taken_heads(conn) == [("op_late", 2)]
    assert await _taken_heads(conn) == []


async def test_two_creations_of_one_operation_racing_write_one_record(
    conn: asyncpg.Connection, database_url: str
) -> None:
    """A creation racing an uncommitted creation of the same id waits for it, then creates
    nothing and writes no record: the stream holds the first creation's record alone."""
    first = await asyncpg.connect(database_url)
    second = await asyncpg.connect(database_url)
    try:
        racing = first.transaction()
        await racing.start()
        assert await _create(first, "op_race") is not None
        pid = await second.fetchval("SELECT pg_backend_pid()")
        late = asyncio.create_task(_create(second, "op_race"))

        async def waiting() -> bool:
            wait = await conn.fetchval(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
            )
            return bool(wait == "Lock")

        await until(waiting, "the second creation waits for the first")
        await racing.commit()
        assert await late is None
    finally:
        await first.close()
        await second.close()
    rows = await conn.fetch("SELECT stream, seq FROM audit_log")
    assert [(r["stream"], r["seq"]) for r in rows] == [("op_race", 1)]
