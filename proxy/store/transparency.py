"""The transparency log's statements (queries.sql ``transparency_*``, migration 0018): the
integrator's rounds (lock, state, pending records, one append), the nodes proofs read,
checkpoints and witnesses' cosignatures, and the reads of ``opgate audit prove|bundle``.
What the rows mean (the tree, the notes) is ``proxy/transparency/``'s; who runs the rounds is
``proxy/observe/auditlog/integrator.py``.

Each function takes the connection: a round is several statements in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from proxy.store import locks, queries


@dataclass(frozen=True)
class State:
    """The tree's size, the transaction id below which every record is a leaf, and the tree
    size the stream heads describe (None: not built yet; migration 0025)."""

    tree_size: int
    floor_txid: int
    heads_size: int | None = None


@dataclass(frozen=True)
class Pending:
    """Records to integrate (txid, stream, seq, hash), and the oldest transaction running
    when they were read."""

    records: list[asyncpg.Record]
    xmin: int


async def try_lock(conn: asyncpg.Connection) -> bool:
    """The integrator's lock, until the transaction ends; False: another replica holds it."""
    return await locks.try_lock(conn, locks.LockKey(locks.LockKind.TRANSPARENCY, ""))


async def state(conn: asyncpg.Connection) -> State:
    row = await queries.fetchrow(conn, "transparency_state")
    assert row is not None, "migration 0018 inserts the state row"
    return State(row["tree_size"], row["floor_txid"], row["heads_size"])


async def pending(conn: asyncpg.Connection, floor_txid: int, limit: int) -> Pending:
    """Visible records at or above the floor without a leaf, in index order."""
    rows = await queries.fetch(conn, "transparency_pending", floor_txid=floor_txid, limit=limit)
    return Pending([r for r in rows if r["stream"] is not None], rows[0]["xmin"])


async def nodes_at(
    conn: asyncpg.Connection, positions: Collection[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    if not positions:
        return {}
    rows = await queries.fetch(
        conn, "transparency_nodes_at", positions=json.dumps(sorted(positions))
    )
    return {(r["level"], r["node_index"]): bytes(r["hash"]) for r in rows}


async def append(
    conn: asyncpg.Connection,
    first_index: int,
    leaves: Sequence[tuple[str, int, bytes]],
    nodes: Sequence[tuple[int, int, bytes]],
    floor_txid: int,
) -> None:
    """A round's leaves (stream, seq, record hash) from ``first_index`` on, its new nodes
    (level, index, hash), and the new floor, in one statement."""
    await queries.execute(
        conn,
        "transparency_append",
        first_index=first_index,
        streams=[leaf[0] for leaf in leaves],
        seqs=[leaf[1] for leaf in leaves],
        record_hashes=[leaf[2] for leaf in leaves],
        node_levels=[node[0] for node in nodes],
        node_indexes=[node[1] for node in nodes],
        node_hashes=[node[2] for node in nodes],
        size=first_index + len(leaves),
        floor_txid=floor_txid,
    )


async def insert_checkpoint(conn: asyncpg.Connection, size: int, root: bytes, note: str) -> None:
    await queries.execute(conn, "transparency_insert_checkpoint", size=size, root=root, note=note)


async def latest_checkpoint(conn: asyncpg.Connection) -> asyncpg.Record | None:
    """The newest checkpoint (tree_size, root, note, at), or None."""
    row: asyncpg.Record | None = await queries.fetchrow(conn, "transparency_latest_checkpoint")
    return row


async def checkpoint_at(conn: asyncpg.Connection, size: int) -> asyncpg.Record | None:
    """The checkpoint of ``size`` with its cosignature lines (``cosignatures``), or None."""
    row: asyncpg.Record | None = await queries.fetchrow(
        conn, "transparency_checkpoint_at", size=size
    )
    return row


async def insert_cosignature(conn: asyncpg.Connection, size: int, witness: str, line: str) -> None:
    await queries.execute(
        conn, "transparency_insert_cosignature", size=size, witness=witness, line=line
    )


async def witness_size(conn: asyncpg.Connection, witness: str) -> int:
    """The size of the last checkpoint ``witness`` cosigned for us (0: none)."""
    size: int = await queries.fetchval(conn, "transparency_witness_size", witness=witness)
    return size


async def leaf(conn: asyncpg.Connection, stream: str, seq: int) -> asyncpg.Record | None:
    """The record's leaf (leaf_index, record_hash), or None when not integrated."""
    row: asyncpg.Record | None = await queries.fetchrow(
        conn, "transparency_leaf", stream=stream, seq=seq
    )
    return row


async def operation_records(conn: asyncpg.Connection, operation_id: str) -> list[asyncpg.Record]:
    """The operation's records with their leaves, and its stream's leaves whose row is gone
    (their record columns NULL)."""
    rows: list[asyncpg.Record] = await queries.fetch(
        conn, "transparency_operation_records", operation_id=operation_id
    )
    return rows


async def records_between(
    conn: asyncpg.Connection, since: datetime, until: datetime, operation_id: str | None
) -> list[asyncpg.Record]:
    """The records written in [since, until) (of one operation, if named), with their leaves."""
    rows: list[asyncpg.Record] = await queries.fetch(
        conn, "transparency_records_between", since=since, until=until, operation_id=operation_id
    )
    return rows


async def leaves_with_records(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Record]:
    """Every leaf with its record as stored now, in index order (a cursor: in the caller's
    transaction)."""
    async for row in queries.cursor(conn, "transparency_leaves_with_records"):
        yield row


async def unintegrated(conn: asyncpg.Connection) -> asyncpg.Record:
    """(records, oldest): the records without a leaf yet."""
    row: asyncpg.Record | None = await queries.fetchrow(conn, "transparency_unintegrated")
    assert row is not None
    return row


async def operation_answers(
    conn: asyncpg.Connection, operation_ids: Sequence[str]
) -> list[asyncpg.Record]:
    """The stored provider answers of these operations (their rows' answer columns)."""
    rows: list[asyncpg.Record] = await queries.fetch(
        conn, "transparency_operation_answers", operation_ids=list(operation_ids)
    )
    return rows


async def mandate_records(
    conn: asyncpg.Connection, operation_ids: Sequence[str]
) -> list[asyncpg.Record]:
    """The mandate presentations' request records of these operations, with their leaves."""
    rows: list[asyncpg.Record] = await queries.fetch(
        conn, "transparency_mandate_records", operation_ids=list(operation_ids)
    )
    return rows


def nodes_in_order(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Record]:
    """Every stored node (level, node_index, hash) in append order (a cursor: in the caller's
    transaction)."""
    cursor: AsyncIterator[asyncpg.Record] = queries.cursor(conn, "transparency_nodes_in_order")
    return cursor


def checkpoints_in_order(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Record]:
    """Every checkpoint (tree_size, root, note), smallest first (a cursor, likewise)."""
    cursor: AsyncIterator[asyncpg.Record] = queries.cursor(
        conn, "transparency_checkpoints_in_order"
    )
    return cursor


async def leafless_integrated(conn: asyncpg.Connection, limit: int) -> list[asyncpg.Record]:
    """Records the integrator made leaves of whose leaf is gone (stream, seq), at most limit."""
    rows: list[asyncpg.Record] = await queries.fetch(
        conn, "transparency_leafless_integrated", limit=limit
    )
    return rows


async def rebuild_heads(conn: asyncpg.Connection, size: int) -> None:
    """Every stream's head from the leaves below ``size``; the buckets' hashes cleared."""
    await queries.execute(conn, "transparency_heads_rebuild", size=size)


async def advance_heads(
    conn: asyncpg.Connection, heads: Sequence[tuple[str, int, int, bytes]], size: int
) -> None:
    """A round's heads (stream, bucket, seq, record hash), and the size they describe."""
    await queries.execute(
        conn,
        "transparency_heads_advance",
        streams=[h[0] for h in heads],
        buckets=[h[1] for h in heads],
        seqs=[h[2] for h in heads],
        record_hashes=[h[3] for h in heads],
        size=size,
    )


async def heads_in_buckets(
    conn: asyncpg.Connection, buckets: Collection[int]
) -> list[asyncpg.Record]:
    """The heads (bucket, stream, seq, record_hash) in these buckets."""
    rows: list[asyncpg.Record] = await queries.fetch(
        conn, "transparency_heads_in_buckets", buckets=sorted(buckets)
    )
    return rows


async def set_head_buckets(conn: asyncpg.Connection, hashes: dict[int, bytes]) -> None:
    if hashes:
        await queries.execute(
            conn,
            "transparency_head_buckets_set",
            buckets=list(hashes),
            hashes=list(hashes.values()),
        )


async def head_buckets(conn: asyncpg.Connection) -> dict[int, bytes]:
    """Every non-empty bucket's hash."""
    rows = await queries.fetch(conn, "transparency_head_buckets_all")
    return {r["bucket"]: bytes(r["hash"]) for r in rows}


async def stream_records(
    conn: asyncpg.Connection, stream: str, first: int, last: int
) -> list[asyncpg.Record]:
    """The records of ``stream`` from ``first`` to ``last`` with their leaves."""
    rows: list[asyncpg.Record] = await queries.fetch(
        conn, "transparency_stream_records", stream=stream, first=first, last=last
    )
    return rows


def heads_from_leaves(conn: asyncpg.Connection, size: int) -> AsyncIterator[asyncpg.Record]:
    """Every stream's head (bucket, stream, seq, record_hash) in the tree of ``size``, from the
    leaves, by bucket (a cursor: in the caller's transaction)."""
    cursor: AsyncIterator[asyncpg.Record] = queries.cursor(
        conn, "transparency_heads_from_leaves", size=size
    )
    return cursor
