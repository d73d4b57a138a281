"""The audit log's statements (queries.sql ``audit_*``): appending records, the runs' traces,
checkpoints, and the reads of the verifier, the exporter and retention. The chaining itself
happens in the database (migrations 0003 and 0010); what the rows mean (the chain's
arithmetic, the records' JSON) is the audit log's own (``proxy/observe/auditlog/``).

Each function takes the connection: the audit log composes several statements in one of its
transactions (a checkpoint, a policy event, a prune), and ``opgate audit`` runs them on a
connection of its own. Errors are translated by whoever handed the connection out
(``Store.run``, as for every other statement); the CLI reports them as they are.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from proxy.store import locks, queries

# From this many records on, a batch is chained by one function instead of the trigger per row
# (PostgreSQL's CPU per record, measured: equal at 4, -18% at 8, -37% at 16, -56% at 64;
# bench/README.md).
MANY_RECORDS = 8


def _array(texts: Sequence[str]) -> str:
    """Records already JSON text, as one JSON array (no parse and re-dump on the way)."""
    return "[" + ",".join(texts) + "]"


def _positions(positions: Sequence[tuple[str, int]]) -> str:
    return json.dumps([[stream, seq] for stream, seq in positions])


async def append_texts(
    conn: asyncpg.Connection, stream: str, kind: str, texts: Sequence[str]
) -> None:
    """Records already JSON text, in order, in one statement: chained row by row by the
    trigger, or from ``MANY_RECORDS`` on by one function that moves the head once (the same
    chain; cheaper for PostgreSQL from there on, dearer below: migration 0010)."""
    query = "audit_append_many" if len(texts) >= MANY_RECORDS else "audit_append_batch"
    await queries.execute(conn, query, stream=stream, kind=kind, records=_array(texts))


async def append_requests(
    conn: asyncpg.Connection, stream: str, texts: Sequence[str], run: dict[str, Any]
) -> int:
    """A request stream's records (JSON text), in order, and how far the run that numbered
    them got (``run``: migration 0012), in one statement. With ``run["batch_first"]`` (the
    first record's position in the run) the records already stored are skipped (migration
    0015: a batch sent again after its commit's answer was lost); returns how many were."""
    many = len(texts) >= MANY_RECORDS
    skipped: int = await queries.fetchval(
        conn,
        "audit_append_requests",
        stream=stream,
        kind="request",
        records=_array(texts),
        run=json.dumps(run),
        many=many,
    )
    return skipped


async def run_seen(conn: asyncpg.Connection, run: dict[str, Any]) -> None:
    """A run's trace without records: a heartbeat, or (``"stopped": true``) its clean stop."""
    await queries.execute(conn, "audit_run_seen", run=json.dumps(run))


async def runs_unaccounted(conn: asyncpg.Connection, heartbeats: float) -> list[asyncpg.Record]:
    """Runs not stopped cleanly, or stopped with numbers never stored (migration 0012)."""
    return await queries.fetch(conn, "audit_runs_unaccounted", heartbeats=heartbeats)


async def set_instance_policy(conn: asyncpg.Connection, instance_id: str, version: Any) -> None:
    """The policy version the instance now decides with (named by its transition records)."""
    await queries.execute(
        conn, "audit_set_instance_policy", instance_id=instance_id, policy_version=version
    )


async def lock_checkpoints(conn: asyncpg.Connection) -> None:
    """One checkpoint writer at a time (until the caller's transaction ends)."""
    await locks.lock(conn, [locks.LockKey(locks.LockKind.AUDIT_CHECKPOINT, "")])


async def take_changed_heads(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """The heads that moved since the last checkpoint (stream, seq, hash), marked taken."""
    return await queries.fetch(conn, "audit_take_changed_heads")


async def last_checkpoint(conn: asyncpg.Connection) -> asyncpg.Record | None:
    return await queries.fetchrow(conn, "audit_last_checkpoint")


async def insert_checkpoint(
    conn: asyncpg.Connection, at: datetime, writer: str, heads: str, prev_mac: bytes, mac: bytes
) -> int:
    """A signed checkpoint; returns its id."""
    checkpoint_id: int = await queries.fetchval(
        conn,
        "audit_insert_checkpoint",
        at=at,
        writer=writer,
        heads=heads,
        prev_mac=prev_mac,
        mac=mac,
    )
    return checkpoint_id


async def checkpoints(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await queries.fetch(conn, "audit_checkpoints")


async def records_between(
    conn: asyncpg.Connection, since: datetime, until: datetime
) -> AsyncIterator[asyncpg.Record]:
    """Each record in [since, until), earliest first, with ``predecessor_hash`` (a cursor:
    in the caller's transaction)."""
    async for row in queries.cursor(conn, "audit_records_between", since=since, until=until):
        yield row


async def records_after(
    conn: asyncpg.Connection, cursor: dict[str, int], limit: int
) -> list[asyncpg.Record]:
    """At most ``limit`` records after the cursor (per stream, the last seq already read)."""
    return await queries.fetch(conn, "audit_records_after", cursor=json.dumps(cursor), limit=limit)


async def records_at(
    conn: asyncpg.Connection, positions: Sequence[tuple[str, int]]
) -> list[asyncpg.Record]:
    """The stored hash at each (stream, seq) (NULL where no record is)."""
    return await queries.fetch(
        conn, "audit_records_at", positions=json.dumps([list(p) for p in positions])
    )


async def heads_mismatched(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await queries.fetch(conn, "audit_heads_mismatched")


async def request_numbering(
    conn: asyncpg.Connection, floors: dict[str, int]
) -> list[asyncpg.Record]:
    """Missing, duplicate and dropped ranges of each instance's request numbers."""
    return await queries.fetch(conn, "audit_request_numbering", floors=json.dumps(floors))


async def retention_records(conn: asyncpg.Connection) -> list[str]:
    """Every prune's record, as JSON text, in order."""
    return [r["record"] for r in await queries.fetch(conn, "audit_retention_records")]


async def prunable(
    conn: asyncpg.Connection, cuts: Sequence[tuple[str, int]]
) -> AsyncIterator[asyncpg.Record]:
    """The records at or before each (stream, seq) cut, in chain order (a cursor: in the
    caller's transaction)."""
    async for row in queries.cursor(conn, "audit_prunable", cuts=_positions(cuts)):
        yield row


async def prune(conn: asyncpg.Connection, cuts: Sequence[tuple[str, int]]) -> int:
    """Delete the records at or before each cut; returns how many."""
    deleted: int = await queries.fetchval(conn, "audit_prune", cuts=_positions(cuts))
    return deleted


async def operation_records(conn: asyncpg.Connection, operation_id: str) -> list[asyncpg.Record]:
    """Every record naming the operation, in order."""
    return await queries.fetch(conn, "audit_operation_records", operation_id=operation_id)


async def reviewer_grants(conn: asyncpg.Connection, role: str) -> list[str]:
    """The GRANT statements of a read-only audit reviewer, the role's name quoted by
    PostgreSQL itself (an identifier cannot be a bound parameter)."""
    return [r["statement"] for r in await queries.fetch(conn, "audit_reviewer_grants", role=role)]


async def grant(conn: asyncpg.Connection, statements: Sequence[str]) -> None:
    """Apply ``reviewer_grants``' statements, all or none."""
    async with conn.transaction():
        for statement in statements:
            await conn.execute(statement)
