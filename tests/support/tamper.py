"""What someone with write access to the database (and no opgate key) does to the audit log."""

from __future__ import annotations

import asyncpg

from proxy.observe.auditlog.chain import GENESIS, record_hash


async def rechain(conn: asyncpg.Connection, stream: str) -> None:
    """Recompute every hash of a stream (SHA-256 needs no key), and its head, so that the
    chain alone looks intact."""
    rows = await conn.fetch(
        "SELECT seq, at, kind, operation_id, record::text AS record FROM audit_log"
        " WHERE stream = $1 ORDER BY seq",
        stream,
    )
    previous = GENESIS
    for row in rows:
        digest = record_hash(
            previous, stream, row["seq"], row["at"], row["kind"], row["operation_id"], row["record"]
        )
        await conn.execute(
            "UPDATE audit_log SET prev_hash = $3, hash = $4 WHERE stream = $1 AND seq = $2",
            stream,
            row["seq"],
            previous,
            digest,
        )
        previous = digest
    await move_head(conn, stream, rows[-1]["seq"] if rows else 0, previous)


async def move_head(conn: asyncpg.Connection, stream: str, seq: int, digest: bytes) -> None:
    """Set a stream's head, wherever it is kept: an operation's on its row (migration 0020),
    any other stream's in audit_heads."""
    await conn.execute(
        "UPDATE audit_heads SET seq = $2, hash = $3 WHERE stream = $1", stream, seq, digest
    )
    await conn.execute(
        "UPDATE operations SET audit_seq = $2, audit_hash = $3 WHERE operation_id = $1",
        stream,
        seq,
        digest,
    )
