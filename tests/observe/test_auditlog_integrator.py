"""The integrator (proxy/observe/auditlog/integrator.py, migration 0018) on a real PostgreSQL:
every committed audit record becomes a leaf, in commit order, none missed when a transaction
commits late, one integrator at a time; checkpoints verify with the public key alone, and the
proofs read from the stored nodes verify against them."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog import integrator
from proxy.observe.auditlog.chain import StoredRecord
from proxy.observe.auditlog.verify import verify
from proxy.store import audit
from proxy.store import transparency as tstore
from proxy.store.migrate import load_migrations, migrate
from proxy.transparency import heads, merkle, note
from proxy.transparency.checkpoint import open_checkpoint, parse_checkpoint
from tests.support.postgres import dsn_for_database

SIGNER = note.Signer.generate("opgate.test/audit")
TRANSPARENCY_MIGRATION = 18  # 0018_transparency.sql
BEGINNING, END = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def append(conn: asyncpg.Connection, stream: str, count: int) -> None:
    texts = [json.dumps({"n": n}) for n in range(count)]
    await audit.append_texts(conn, stream, "request", texts)


async def stored(conn: asyncpg.Connection) -> list[StoredRecord]:
    rows = await conn.fetch(
        "SELECT stream, seq, at, kind, operation_id, record::text AS record, prev_hash, hash"
        " FROM audit_log ORDER BY stream, seq"
    )
    return [StoredRecord(**dict(r.items())) for r in rows]


async def test_every_record_is_a_leaf_whose_proof_verifies(conn: asyncpg.Connection) -> None:
    """Records of three streams (one batch chained by the function, others by the trigger)
    are integrated; the checkpoint opens with the public key alone, and each record's content
    hashes to its leaf, whose audit path verifies against the checkpoint's root."""
    await append(conn, "requests/a", 3)
    await append(conn, "requests/b", audit.MANY_RECORDS + 1)
    await append(conn, "policy", 1)
    done = await integrator.integrate(conn, SIGNER)
    assert done is not None
    records = await stored(conn)
    assert done.size == done.added == len(records)
    opened = open_checkpoint(done.checkpoint, SIGNER.verifier())
    assert opened.checkpoint.size == done.size
    assert opened.checkpoint.root == done.root
    for record in records:
        leaf = await tstore.leaf(conn, record.stream, record.seq)
        assert leaf is not None
        assert bytes(leaf["record_hash"]) == record.expected_hash()
        proof = await integrator.inclusion(conn, leaf["leaf_index"], done.size)
        digest = integrator.record_leaf(record.expected_hash())
        assert merkle.verify_inclusion(digest, leaf["leaf_index"], done.size, proof, done.root)


async def test_a_later_round_is_consistent_with_the_earlier_one(conn: asyncpg.Connection) -> None:
    """Two rounds give two checkpoints; the consistency proof between them verifies, and a
    round with nothing new signs nothing new."""
    await append(conn, "requests/a", 5)
    first = await integrator.integrate(conn, SIGNER)
    await append(conn, "requests/a", 7)
    await append(conn, "requests/c", 2)
    second = await integrator.integrate(conn, SIGNER)
    assert first is not None
    assert second is not None
    assert (first.size, second.size) == (5, 14)
    proof = await integrator.consistency(conn, first.size, second.size)
    assert merkle.verify_consistency(first.size, second.size, first.root, second.root, proof)
    again = await integrator.integrate(conn, SIGNER)
    assert again == integrator.Integrated(second.size, second.root, second.checkpoint, 0)
    assert await conn.fetchval("SELECT count(*) FROM transparency_checkpoints") == 2


async def test_a_transaction_that_commits_late_is_not_skipped(
    conn: asyncpg.Connection, database_url: str
) -> None:
    """A record whose transaction is still open is not seen; the one committed meanwhile is
    integrated, and once the first commits it follows: in commit order, none skipped, none
    twice."""
    late = await asyncpg.connect(database_url)
    try:
        transaction = late.transaction()
        await transaction.start()
        await append(late, "requests/late", 1)
        await append(conn, "requests/early", 1)  # begins and commits after the late one began
        held = await integrator.integrate(conn, SIGNER)
        assert held is not None
        assert held.size == 1
        await transaction.commit()
    finally:
        await late.close()
    done = await integrator.integrate(conn, SIGNER)
    assert done is not None
    assert done.size == 2
    leaves = await conn.fetch("SELECT stream FROM transparency_leaves ORDER BY leaf_index")
    assert [r["stream"] for r in leaves] == ["requests/early", "requests/late"]


async def test_one_integrator_at_a_time(conn: asyncpg.Connection, database_url: str) -> None:
    """While one replica's round holds the lock, another's round skips (None)."""
    await append(conn, "requests/a", 1)
    other = await asyncpg.connect(database_url)
    try:
        async with other.transaction():
            assert await tstore.try_lock(other)
            assert await integrator.integrate(conn, SIGNER) is None
        done = await integrator.integrate(conn, SIGNER)
        assert done is not None
        assert done.size == 1
    finally:
        await other.close()


async def test_a_database_holding_old_chains_is_migrated_and_integrated(
    pg_server_dsn: str,
) -> None:
    """Chains written before migration 0018 (no transaction id) keep verifying after it, and
    the first round makes them the tree's first leaves, before the records written after."""
    name = "opgate_premigration_" + os.urandom(6).hex()
    admin = await asyncpg.connect(pg_server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = dsn_for_database(pg_server_dsn, name)
    try:
        old = await asyncpg.connect(url)
        try:
            await old.execute(
                "CREATE TABLE opgate_migrations (number integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for migration in load_migrations():
                if migration.number < TRANSPARENCY_MIGRATION:
                    await old.execute(migration.sql)
                    await old.execute(
                        "INSERT INTO opgate_migrations (number, name) VALUES ($1, $2)",
                        migration.number,
                        migration.name,
                    )
            await append(old, "requests/old", audit.MANY_RECORDS + 2)
            await append(old, "policy", 1)
        finally:
            await old.close()
        applied = await migrate(url)  # the transparency migration and any after it
        assert applied[0] == TRANSPARENCY_MIGRATION
        assert applied == sorted(m.number for m in load_migrations() if m.number >= applied[0])
        conn = await asyncpg.connect(url)
        try:
            await append(conn, "requests/new", 2)
            done = await integrator.integrate(conn, SIGNER)
            assert done is not None
            assert done.size == audit.MANY_RECORDS + 5
            leaves = await conn.fetch("SELECT stream FROM transparency_leaves ORDER BY leaf_index")
            assert [r["stream"] for r in leaves][-2:] == ["requests/new", "requests/new"]
            for record in await stored(conn):
                leaf = await tstore.leaf(conn, record.stream, record.seq)
                assert leaf is not None
                proof = await integrator.inclusion(conn, leaf["leaf_index"], done.size)
                digest = integrator.record_leaf(record.expected_hash())
                assert merkle.verify_inclusion(
                    digest, leaf["leaf_index"], done.size, proof, done.root
                )
            report = await verify(conn, BEGINNING, END, key=None, whole_log=True)
            assert report.first_break() is None
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_a_backlog_over_the_round_limit_skips_no_late_commit(
    conn: asyncpg.Connection, database_url: str
) -> None:
    """A transaction that took its id before a backlog larger than a round, and commits its
    record after a round was cut by the limit: a later round integrates it (the floor never
    passes a transaction open in the round's snapshot), and the tree verifies."""
    late = await asyncpg.connect(database_url)
    try:
        transaction = late.transaction()
        await transaction.start()
        await late.fetchval("SELECT txid_current()")  # its id, below every backlog record's
        await append(late, "requests/late", 1)
        for _ in range(8):
            await append(conn, "requests/backlog", 1)
        first = await integrator.integrate(conn, SIGNER, limit=5)
        assert first is not None
        assert first.added == 5
        await transaction.commit()
    finally:
        await late.close()
    while (done := await integrator.integrate(conn, SIGNER, limit=5)) and done.added:
        pass
    assert await tstore.leaf(conn, "requests/late", 1) is not None
    assert await tstore.leafless_integrated(conn, 10) == []


async def test_the_heads_rebuilt_from_the_leaves_are_the_heads_the_rounds_kept(
    conn: asyncpg.Connection,
) -> None:
    """Stream heads kept round by round (buckets computed in Python) and rebuilt from the
    leaves (buckets computed by PostgreSQL, migration 0025) are the same rows and sign the same
    root; the checkpoint carries it, and each stream's head is its last record."""
    for stream in ("requests/a", "policy", "op_é✓", "requests/host:1:2"):
        await append(conn, stream, 3)
        assert await integrator.integrate(conn, SIGNER) is not None
    await append(conn, "requests/a", 2)
    kept = await integrator.integrate(conn, SIGNER)
    assert kept is not None
    read = "SELECT stream, bucket, seq, record_hash FROM transparency_heads ORDER BY stream"
    rounds = [tuple(r) for r in await conn.fetch(read)]
    assert ("requests/a", heads.bucket_of("requests/a")) == rounds[-2][:2]
    assert [(r[0], r[2]) for r in rounds] == [
        ("op_é✓", 3),
        ("policy", 3),
        ("requests/a", 5),
        ("requests/host:1:2", 3),
    ]
    signed = parse_checkpoint(note.parse_note(kept.checkpoint).text).extensions
    await conn.execute("UPDATE transparency_state SET heads_size = NULL")
    await append(conn, "policy", 1)
    rebuilt = await integrator.integrate(conn, SIGNER)
    assert rebuilt is not None
    after = [tuple(r) for r in await conn.fetch(read)]
    assert [r for r in after if r[0] != "policy"] == [r for r in rounds if r[0] != "policy"]
    assert heads.signed_root(signed) is not None
    for stream, bucket, _, _ in after:
        assert bucket == heads.bucket_of(stream)
