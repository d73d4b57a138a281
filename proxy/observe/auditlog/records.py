"""Reading and appending audit records in PostgreSQL. Every statement is a named query of
``proxy/store/queries.sql``; the chaining itself happens in the database (migration 0003).

asyncpg errors are left to the callers here: the writer translates them (it retries), the CLI
reports them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from proxy.observe.auditlog.chain import (
    GENESIS,
    Checkpoint,
    Head,
    StoredRecord,
    checkpoint_mac,
    heads_from_json,
    heads_json,
)
from proxy.store.queries import QUERIES

STREAM_POLICY = "policy"


def request_stream(instance_id: str) -> str:
    """Each opgate instance appends its agent-request records to a stream of its own."""
    return f"requests/{instance_id}"


async def append_batch(
    conn: asyncpg.Connection, stream: str, kind: str, records: Sequence[dict[str, Any]]
) -> None:
    await conn.execute(QUERIES["audit_append_batch"], stream, kind, json.dumps(list(records)))


async def record_policy_event(
    conn: asyncpg.Connection, instance_id: str, record: dict[str, Any], *, now_deciding: bool
) -> None:
    """A policy load, reload or refused reload; when ``now_deciding``, the instance's current
    version (named by its transition records) changes in the same transaction."""
    async with conn.transaction():
        if now_deciding:
            await conn.execute(
                QUERIES["audit_set_instance_policy"], instance_id, record["policy_version"]
            )
        await append_batch(conn, STREAM_POLICY, "policy_load", [record])


async def write_checkpoint(
    conn: asyncpg.Connection, key: bytes, writer: str
) -> tuple[int, bytes] | None:
    """Sign the heads that moved since the last checkpoint: (id, mac), or None when none did."""
    async with conn.transaction():
        await conn.execute(QUERIES["audit_checkpoint_lock"])
        rows = await conn.fetch(QUERIES["audit_take_changed_heads"])
        if not rows:
            return None
        heads = heads_json(Head(r["stream"], r["seq"], bytes(r["hash"])) for r in rows)
        last = await conn.fetchrow(QUERIES["audit_last_checkpoint"])
        prev_mac = bytes(last["mac"]) if last else GENESIS
        at = datetime.now(UTC)
        mac = checkpoint_mac(key, prev_mac, at, writer, heads)
        checkpoint_id: int = await conn.fetchval(
            QUERIES["audit_insert_checkpoint"], at, writer, heads, prev_mac, mac
        )
        return checkpoint_id, mac


def _stored(row: asyncpg.Record) -> StoredRecord:
    return StoredRecord(
        stream=row["stream"],
        seq=row["seq"],
        at=row["at"],
        kind=row["kind"],
        operation_id=row["operation_id"],
        record=row["record"],
        prev_hash=bytes(row["prev_hash"]),
        hash=bytes(row["hash"]),
    )


async def records_between(
    conn: asyncpg.Connection, since: datetime, until: datetime
) -> AsyncIterator[tuple[StoredRecord, bytes | None]]:
    """Each record in [since, until), earliest first, with its predecessor's stored hash."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        async for row in conn.cursor(QUERIES["audit_records_between"], since, until):
            predecessor = row["predecessor_hash"]
            yield _stored(row), None if predecessor is None else bytes(predecessor)


async def checkpoints(conn: asyncpg.Connection) -> list[Checkpoint]:
    return [
        Checkpoint(
            checkpoint_id=r["checkpoint_id"],
            at=r["at"],
            writer=r["writer"],
            heads=heads_from_json(r["heads"]),
            prev_mac=bytes(r["prev_mac"]),
            mac=bytes(r["mac"]),
        )
        for r in await conn.fetch(QUERIES["audit_checkpoints"])
    ]


async def hashes_at(
    conn: asyncpg.Connection, positions: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], bytes | None]:
    rows = await conn.fetch(QUERIES["audit_records_at"], json.dumps([list(p) for p in positions]))
    return {(r["stream"], r["seq"]): None if r["hash"] is None else bytes(r["hash"]) for r in rows}


async def mismatched_heads(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(QUERIES["audit_heads_mismatched"])
    return rows


async def operation_records(conn: asyncpg.Connection, operation_id: str) -> list[StoredRecord]:
    return [_stored(r) for r in await conn.fetch(QUERIES["audit_operation_records"], operation_id)]
