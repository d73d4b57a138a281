"""``opgate audit verify`` finds missing request records, not only broken chains: each
instance numbers its request records (``instance_seq``, in the log line and the stored record),
and a gap in the stored numbers is reported with the instance and the missing range; records
the writer had to drop are reported as dropped."""

from __future__ import annotations

import asyncio

import asyncpg
from structlog.testing import capture_logs

from proxy.observe.auditlog.chain import GENESIS, record_hash
from tests.support.auditlog import FLUSH_DEADLINE, flushed, get, run_cli, stored_requests
from tests.support.opgate import AGENT_TOKEN, Opgate

READ = "/fault/v1/charges/ch_1"


async def _untriggered(conn: asyncpg.Connection, sql: str, *args: object) -> None:
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(sql, *args)


async def _rehash(conn: asyncpg.Connection, stream: str) -> None:
    """What an attacker does after deleting a record: renumber the chain, recompute every
    hash (SHA-256 needs no key) and move the head, so that the chain itself is intact."""
    rows = await conn.fetch(
        "SELECT seq, at, kind, operation_id, record::text AS record FROM audit_log"
        " WHERE stream = $1 ORDER BY seq",
        stream,
    )
    prev = GENESIS
    for position, r in enumerate(rows, start=1):
        at, kind, operation_id = r["at"], r["kind"], r["operation_id"]
        new = record_hash(prev, stream, position, at, kind, operation_id, r["record"])
        await _untriggered(
            conn,
            "UPDATE audit_log SET seq = $3, prev_hash = $4, hash = $5"
            " WHERE stream = $1 AND seq = $2",
            stream,
            r["seq"],
            position,
            prev,
            new,
        )
        prev = new
    await conn.execute(
        "UPDATE audit_heads SET seq = $2, hash = $3 WHERE stream = $1", stream, len(rows), prev
    )


async def test_a_deleted_request_record_is_reported_with_its_instance_and_range(
    fault_gate: Opgate, database_url: str
) -> None:
    """Two request records deleted and the chain re-hashed around them: the chain verifies,
    but verify reports the instance's missing numbers, and the CLI exits 1 naming them."""
    for _ in range(6):
        assert await get(fault_gate, READ, AGENT_TOKEN) == 200
    await flushed(fault_gate)
    instance = fault_gate.running.gateway.settings.instance_id
    stream = f"requests/{instance}"
    conn = await asyncpg.connect(database_url)
    try:
        chain_seqs = await conn.fetch(
            "SELECT seq FROM audit_log WHERE stream = $1 AND record ? 'request_id' ORDER BY seq",
            stream,
        )
        third, fourth = chain_seqs[2]["seq"], chain_seqs[3]["seq"]
        await _untriggered(
            conn,
            "DELETE FROM audit_log WHERE stream = $1 AND seq IN ($2, $3)",
            stream,
            third,
            fourth,
        )
        await _rehash(conn, stream)
    finally:
        await conn.close()
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
    assert code == 1, out
    assert f"stream {stream}: request records of instance {instance} missing: 3-4" in out


async def test_dropped_records_are_reported_as_dropped(
    fault_gate: Opgate, database_url: str
) -> None:
    """Records the writer dropped (its queue full while the database refused them) are stored
    as a `dropped` record naming their numbers; verify says so and still exits 0."""
    observability = fault_gate.running.gateway.observability
    assert observability is not None
    assert observability.writer is not None
    writer = observability.writer
    writer.max_pending = 3
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "ALTER TABLE audit_log ADD CONSTRAINT refuse_requests CHECK (kind <> 'request')"
            " NOT VALID"
        )
        await asyncio.wait_for(writer.flush(), FLUSH_DEADLINE)  # the start record is held too
        for _ in range(6):
            assert await get(fault_gate, READ, AGENT_TOKEN) == 200
        assert writer.dropped == 3
        await conn.execute("ALTER TABLE audit_log DROP CONSTRAINT refuse_requests")
        await flushed(fault_gate)
        assert await get(fault_gate, READ, AGENT_TOKEN) == 200
        await flushed(fault_gate)
    finally:
        await conn.close()
    stored = await stored_requests(database_url)
    [dropped] = [r for r in stored if r.get("record_type") == "dropped"]
    assert (dropped["dropped"], dropped["count"]) == ([[4, 6]], 3)
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
    assert code == 0, out
    instance = fault_gate.running.gateway.settings.instance_id
    assert f"request records of instance {instance} dropped before storage: 4-6" in out


async def test_numbers_in_log_lines_and_stored_records_agree(
    fault_gate: Opgate, database_url: str
) -> None:
    """Each request's log line and its stored record carry the same instance_seq, 1, 2, 3..."""
    with capture_logs() as logs:
        for _ in range(3):
            assert await get(fault_gate, READ, AGENT_TOKEN) == 200
    await flushed(fault_gate)
    logged = {e["request_id"]: e["instance_seq"] for e in logs if e["event"] == "request"}
    stored = {
        r["request_id"]: r["instance_seq"]
        for r in await stored_requests(database_url)
        if r.get("request_id")
    }
    assert logged == stored
    assert sorted(stored.values()) == [1, 2, 3]


def _env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin"}
