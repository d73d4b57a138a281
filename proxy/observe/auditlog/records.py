"""Reading and appending audit records in PostgreSQL: the records' JSON and the chain's types
here, every statement behind the store (``proxy/store/audit.py``); the chaining itself happens
in the database (migrations 0003 and 0010).

asyncpg errors are left to the callers here: the writer translates them (it retries), the CLI
reports them.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from proxy.observe.auditlog.chain import (
    GENESIS,
    Checkpoint,
    Head,
    StoredRecord,
    checkpoint_mac,
    heads_from_json,
    heads_json,
)
from proxy.observe.auditlog.storable import storable
from proxy.store import audit
from proxy.store.audit import MANY_RECORDS as MANY_RECORDS

STREAM_POLICY = "policy"
STREAM_RETENTION = "retention"  # one record per prune (retention.py); never pruned itself


REQUEST_STREAM_PREFIX = "requests/"


def request_stream(instance_id: str) -> str:
    """Each opgate instance appends its agent-request records to a stream of its own."""
    return REQUEST_STREAM_PREFIX + instance_id


def record_text(record: dict[str, Any]) -> str:
    """The JSON a record is stored as: the one place every appended record passes through,
    so none can hold what PostgreSQL refuses (storable.py). Raises ValueError for a value JSON
    cannot hold (a NaN): the writer stores a placeholder instead.

    Always the text of ``json.dumps(..., separators=(",", ":"), allow_nan=False,
    default=str)``; a flat record (a request's, as a rule) is made by orjson, a seventh of
    the time, where orjson's bytes are provably those: ASCII strings (json escapes the rest,
    and DEL), finite floats spelt without an exponent (orjson writes NaN as null, and
    ``1e-05`` as ``1e-5``), integers of 64 bits (orjson refuses larger ones), string keys.
    tests/observe/test_auditlog_records.py compares the two on many records."""
    made = storable(record)
    if _orjson_spells_alike(made):
        try:
            text = orjson.dumps(made)
        except orjson.JSONEncodeError:  # an integer beyond 64 bits, a key not a string
            pass
        else:
            if text.isascii() and b"\x7f" not in text:
                return text.decode("ascii")
    return json.dumps(made, separators=(",", ":"), allow_nan=False, default=str)


_FLAT_TYPES = frozenset({type(None), str, int, bool, float})


def _orjson_spells_alike(made: Any) -> bool:
    """Whether ``made`` is a dict of scalars and strings whose floats orjson and json spell
    alike: finite, 0 or of a magnitude in [1e-4, 1e16) (repr's range without an exponent).
    The strings are checked on orjson's output (ASCII, no DEL)."""
    if type(made) is not dict:
        return False
    values = made.values()
    if not _FLAT_TYPES.issuperset(map(type, values)):
        return False
    return all(
        v == 0.0 or 1e-4 <= abs(v) < 1e16  # False for NaN; infinities are out of range
        for v in values
        if type(v) is float
    )


async def append_texts(
    conn: asyncpg.Connection, stream: str, kind: str, texts: Sequence[str]
) -> None:
    """Records already made ``record_text``, in order, in one statement: chained row by row by
    the trigger, or from ``MANY_RECORDS`` on by one function that moves the head once (the
    same chain; cheaper for PostgreSQL from there on, dearer below: migration 0010)."""
    await audit.append_texts(conn, stream, kind, texts)


async def append_requests(
    conn: asyncpg.Connection, stream: str, texts: Sequence[str], run: dict[str, Any]
) -> int:
    """A request stream's records (made ``record_text``), in order, and how far the run that
    numbered them got (``run``: migration 0012), in one statement. With ``run["batch_first"]``
    (the first record's position in the run) the records already stored are skipped
    (migration 0015); returns how many were."""
    return await audit.append_requests(conn, stream, texts, run)


async def run_seen(conn: asyncpg.Connection, run: dict[str, Any]) -> None:
    """A run's trace without records: a heartbeat, or (``"stopped": true``) its clean stop."""
    await audit.run_seen(conn, run)


async def runs_unaccounted(conn: asyncpg.Connection, heartbeats: float) -> list[asyncpg.Record]:
    """Runs not stopped cleanly, or stopped with numbers never stored (migration 0012)."""
    return await audit.runs_unaccounted(conn, heartbeats)


async def append_batch(
    conn: asyncpg.Connection, stream: str, kind: str, records: Sequence[dict[str, Any]]
) -> None:
    await append_texts(conn, stream, kind, [record_text(r) for r in records])


async def record_policy_event(
    conn: asyncpg.Connection, instance_id: str, record: dict[str, Any], *, now_deciding: bool
) -> None:
    """A policy load, reload or refused reload; when ``now_deciding``, the instance's current
    version (named by its transition records) changes in the same transaction."""
    async with conn.transaction():
        if now_deciding:
            await audit.set_instance_policy(conn, instance_id, record["policy_version"])
        await append_batch(conn, STREAM_POLICY, "policy_load", [record])


async def write_checkpoint(
    conn: asyncpg.Connection, key: bytes, writer: str
) -> tuple[int, bytes] | None:
    """Sign the heads that moved since the last checkpoint: (id, mac), or None when none did."""
    async with conn.transaction():
        await audit.lock_checkpoints(conn)
        rows = await audit.take_changed_heads(conn)
        if not rows:
            return None
        heads = heads_json(Head(r["stream"], r["seq"], bytes(r["hash"])) for r in rows)
        last = await audit.last_checkpoint(conn)
        prev_mac = bytes(last["mac"]) if last else GENESIS
        at = datetime.now(UTC)
        mac = checkpoint_mac(key, prev_mac, at, writer, heads)
        checkpoint_id = await audit.insert_checkpoint(conn, at, writer, heads, prev_mac, mac)
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
        async for row in audit.records_between(conn, since, until):
            predecessor = row["predecessor_hash"]
            yield _stored(row), None if predecessor is None else bytes(predecessor)


async def records_after(
    conn: asyncpg.Connection, cursor: dict[str, int], limit: int
) -> list[StoredRecord]:
    """At most ``limit`` records after the cursor (per stream, the last seq already read)."""
    return [_stored(row) for row in await audit.records_after(conn, cursor, limit)]


def read_cursor(path: Path) -> dict[str, int]:
    """An export cursor file: {"stream": seq, ...}; a missing file is the beginning."""
    if not path.exists():
        return {}
    loaded = json.loads(path.read_text("utf-8"))
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in loaded.items()
    ):
        raise ValueError(f"{path} is not an export cursor")
    return loaded


def write_cursor(path: Path, cursor: dict[str, int]) -> None:
    """Replaced whole (written aside, then renamed): a crash leaves the old cursor or the new,
    never half of one."""
    aside = path.with_name(path.name + ".tmp")
    aside.write_text(json.dumps(cursor, sort_keys=True), "utf-8")
    os.replace(aside, path)


async def reviewer_grants(conn: asyncpg.Connection, role: str) -> list[str]:
    """The GRANT statements of a read-only audit reviewer, the role's name quoted by
    PostgreSQL itself (an identifier cannot be a bound parameter)."""
    return await audit.reviewer_grants(conn, role)


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
        for r in await audit.checkpoints(conn)
    ]


async def hashes_at(
    conn: asyncpg.Connection, positions: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], bytes | None]:
    rows = await audit.records_at(conn, positions)
    return {(r["stream"], r["seq"]): None if r["hash"] is None else bytes(r["hash"]) for r in rows}


async def mismatched_heads(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await audit.heads_mismatched(conn)


async def request_numbering(
    conn: asyncpg.Connection, floors: dict[str, int]
) -> list[asyncpg.Record]:
    """Missing, duplicate and dropped ranges of each instance's request numbers."""
    return await audit.request_numbering(conn, floors)


async def retention_records(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [json.loads(text) for text in await audit.retention_records(conn)]


async def prunable(
    conn: asyncpg.Connection, cuts: Sequence[tuple[str, int]]
) -> AsyncIterator[StoredRecord]:
    """The records at or before each (stream, seq) cut, in chain order (in a transaction)."""
    async for row in audit.prunable(conn, cuts):
        yield _stored(row)


async def prune(
    conn: asyncpg.Connection, cuts: Sequence[tuple[str, int]], record: dict[str, Any]
) -> int:
    """Append the prune's record and delete what it covers (in the caller's transaction)."""
    await append_batch(conn, STREAM_RETENTION, "retention", [record])
    return await audit.prune(conn, cuts)


async def operation_records(conn: asyncpg.Connection, operation_id: str) -> list[StoredRecord]:
    return [_stored(r) for r in await audit.operation_records(conn, operation_id)]
