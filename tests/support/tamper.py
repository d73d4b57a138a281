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
    await conn.execute(
        "UPDATE audit_heads SET seq = $2, hash = $3 WHERE stream = $1",
        stream,
        rows[-1]["seq"] if rows else 0,
        previous,
    )
