"""The tamper-evident audit log (migration 0003, proxy/observe/auditlog/): real traffic through
opgate writes the chains; direct SQL tampers with them; ``verify`` must find each change and
name it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from proxy.observe.auditlog import records
from proxy.observe.auditlog.chain import GENESIS, record_hash
from proxy.observe.auditlog.verify import VerifyReport, verify
from tests.support.auditlog import AUDIT_KEY, run_cli
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import StartOpgate, fault_policy
from tests.support.tamper import move_head

BEGINNING, END = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)


@pytest_asyncio.fixture(loop_scope="session")
async def audited_db(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[asyncpg.Connection]:
    """A database with real audit records: 3 confirmed operations, one refused request, the
    policy load, and a signed checkpoint of every head (written when opgate stops)."""
    monkeypatch.setenv("OPGATE_SECRET_AUDIT_KEY", AUDIT_KEY)
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        for _ in range(3):
            op = await gate.approve()
            status, _, _ = await gate.send(
                "/fault/v1/refunds",
                data="amount=500&currency=usd&charge=ch_1",
                headers={"X-Operation-Id": op["operation_id"]},
            )
            assert status == 200
        status, _, _ = await gate.send("/fault/v1/refunds", data="amount=1", headers={})
        assert status == 400
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()


async def _verify(conn: asyncpg.Connection) -> VerifyReport:
    return await verify(conn, BEGINNING, END, key=AUDIT_KEY.encode(), whole_log=True)


async def _an_operation_stream(conn: asyncpg.Connection) -> str:
    stream: str = await conn.fetchval(
        "SELECT stream FROM audit_log WHERE kind = 'transition' ORDER BY at LIMIT 1"
    )
    return stream


async def _untriggered(conn: asyncpg.Connection, sql: str, *args: object) -> None:
    """What an attacker with write access does: writes around the chaining trigger."""
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(sql, *args)


async def test_untouched_log_verifies(audited_db: asyncpg.Connection) -> None:
    """Real traffic (transitions, request records, policy load) verifies, checkpoints included."""
    report = await _verify(audited_db)
    assert report.ok, [b.describe() for b in report.breaks]
    kinds = {r["kind"] for r in await audited_db.fetch("SELECT kind FROM audit_log")}
    assert kinds == {"transition", "request", "policy_load"}
    assert report.records == await audited_db.fetchval("SELECT count(*) FROM audit_log")
    assert report.checkpoints >= 1
    assert report.checkpoints_authenticated


async def test_python_and_sql_hash_alike(audited_db: asyncpg.Connection) -> None:
    """The verifier's hash is the database's hash, record by record."""
    rows = await audited_db.fetch(
        "SELECT stream, seq, at, kind, operation_id, record::text AS record, prev_hash, hash,"
        " opgate_audit_hash(prev_hash, stream, seq, at, kind, operation_id, record) AS sql_hash"
        " FROM audit_log"
    )
    for r in rows:
        mine = record_hash(
            bytes(r["prev_hash"]),
            r["stream"],
            r["seq"],
            r["at"],
            r["kind"],
            r["operation_id"],
            r["record"],
        )
        assert mine == bytes(r["hash"]) == bytes(r["sql_hash"])
    assert {bytes(r["prev_hash"]) for r in rows if r["seq"] == 1} == {GENESIS}


async def test_an_edited_field_is_named(audited_db: asyncpg.Connection) -> None:
    """Changing one field of one record breaks that record, and verify names it."""
    stream = await _an_operation_stream(audited_db)
    await _untriggered(
        audited_db,
        "UPDATE audit_log SET record = jsonb_set(record, '{actor}', '\"someone-else\"')"
        " WHERE stream = $1 AND seq = 2",
        stream,
    )
    first = (await _verify(audited_db)).first_break()
    assert first is not None
    assert (first.stream, first.seq) == (stream, 2)
    assert "does not match its hash" in first.problem


async def test_a_deleted_record_is_named(audited_db: asyncpg.Connection) -> None:
    """Deleting a record from the middle of a chain is found at the record after it."""
    stream = await _an_operation_stream(audited_db)
    await _untriggered(audited_db, "DELETE FROM audit_log WHERE stream = $1 AND seq = 2", stream)
    report = await _verify(audited_db)
    first = report.first_break()
    assert first is not None
    assert (first.stream, first.seq) == (stream, 3)
    assert "record 2 of this stream is missing" in first.problem


async def test_a_deleted_tail_is_caught_by_the_signed_checkpoint(
    audited_db: asyncpg.Connection,
) -> None:
    """Deleting a stream's last record and moving its head back is found by the checkpoint."""
    stream = await _an_operation_stream(audited_db)
    last = await audited_db.fetchval("SELECT max(seq) FROM audit_log WHERE stream = $1", stream)
    await _untriggered(
        audited_db, "DELETE FROM audit_log WHERE stream = $1 AND seq = $2", stream, last
    )
    previous = await audited_db.fetchval(
        "SELECT hash FROM audit_log WHERE stream = $1 AND seq = $2", stream, last - 1
    )
    await move_head(audited_db, stream, last - 1, previous)
    report = await _verify(audited_db)
    assert [(b.stream, b.seq) for b in report.breaks] == [(stream, last)]
    assert "signed by checkpoint" in report.breaks[0].problem


async def test_a_forged_record_is_named(audited_db: asyncpg.Connection) -> None:
    """A record forged into the middle of a chain (later ones renumbered, the forgery hashed
    correctly onto its predecessor) is found where the chain no longer links."""
    stream = await _an_operation_stream(audited_db)
    prev = await audited_db.fetchrow(
        "SELECT hash FROM audit_log WHERE stream = $1 AND seq = 1", stream
    )
    await _untriggered(
        audited_db,
        "UPDATE audit_log SET seq = seq + 1000 WHERE stream = $1 AND seq >= 2",
        stream,
    )
    await _untriggered(
        audited_db,
        "UPDATE audit_log SET seq = seq - 999 WHERE stream = $1 AND seq >= 1000",
        stream,
    )
    forged = '{"event": "confirmed", "actor": "attacker"}'
    at = datetime.now(UTC)
    forged_hash = record_hash(bytes(prev["hash"]), stream, 2, at, "transition", stream, forged)
    await _untriggered(
        audited_db,
        "INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)"
        " VALUES ($1, 2, $2, 'transition', $1, $3::jsonb, $4, $5)",
        stream,
        at,
        forged,
        bytes(prev["hash"]),
        forged_hash,
    )
    report = await _verify(audited_db)
    broken = {(b.stream, b.seq) for b in report.breaks}
    # The forgery itself links (the attacker can compute SHA-256); the genuine record it
    # displaced cannot be re-linked without changing its hash, which covers its position.
    assert (stream, 3) in broken
    first = report.first_break()
    assert first is not None
    assert (first.stream, first.seq) == (stream, 3)


async def test_two_swapped_records_are_named(audited_db: asyncpg.Connection) -> None:
    """Swapping the contents of two neighbouring records breaks the earlier one first."""
    stream = await _an_operation_stream(audited_db)
    await _untriggered(
        audited_db,
        "UPDATE audit_log a SET record = b.record FROM audit_log b"
        " WHERE a.stream = $1 AND b.stream = $1 AND (a.seq, b.seq) IN ((1, 2), (2, 1))",
        stream,
    )
    report = await _verify(audited_db)
    assert {(b.stream, b.seq) for b in report.breaks if b.at} == {(stream, 1), (stream, 2)}
    first = report.first_break()
    assert first is not None
    assert (first.stream, first.seq) == (stream, 1)


async def test_a_rewritten_chain_is_caught_by_the_signature(
    audited_db: asyncpg.Connection,
) -> None:
    """Editing a record and recomputing every hash after it (no key needed for SHA-256) still
    fails: the signed checkpoint named the old head."""
    stream = await _an_operation_stream(audited_db)
    await _untriggered(
        audited_db,
        "UPDATE audit_log SET record = jsonb_set(record, '{actor}', '\"someone-else\"')"
        " WHERE stream = $1 AND seq = 1",
        stream,
    )
    rows = await audited_db.fetch(
        "SELECT seq, at, kind, operation_id, record::text AS record FROM audit_log"
        " WHERE stream = $1 ORDER BY seq",
        stream,
    )
    prev = GENESIS
    for r in rows:
        new = record_hash(
            prev, stream, r["seq"], r["at"], r["kind"], r["operation_id"], r["record"]
        )
        await _untriggered(
            audited_db,
            "UPDATE audit_log SET prev_hash = $3, hash = $4 WHERE stream = $1 AND seq = $2",
            stream,
            r["seq"],
            prev,
            new,
        )
        prev = new
    await move_head(audited_db, stream, rows[-1]["seq"], prev)
    report = await _verify(audited_db)
    assert [b.stream for b in report.breaks] == [stream]
    assert "differs from the hash checkpoint" in report.breaks[0].problem
    unsigned = await verify(audited_db, BEGINNING, END, key=None, whole_log=True)
    assert [b.stream for b in unsigned.breaks] == [stream]  # the stored claim differs too


async def test_a_forged_checkpoint_is_refused(audited_db: asyncpg.Connection) -> None:
    """A checkpoint edited to cover a rewrite does not verify without the key."""
    await audited_db.execute(
        "UPDATE audit_checkpoints SET heads = '[]'::jsonb"
        " WHERE checkpoint_id = (SELECT max(checkpoint_id) FROM audit_checkpoints)"
    )
    report = await _verify(audited_db)
    assert [b.stream for b in report.breaks] == ["(checkpoints)"]
    assert "signature does not verify" in report.breaks[0].problem


async def test_the_cli_names_the_first_broken_record(
    audited_db: asyncpg.Connection, database_url: str
) -> None:
    """`opgate audit verify` exits 0 on an intact log, 1 naming the broken record otherwise,
    and honours --since/--until."""
    command = ["audit", "verify", "--database-url", database_url]
    env = {"OPGATE_SECRET_AUDIT_KEY": AUDIT_KEY, "PATH": "/usr/bin:/bin"}
    code, out = await run_cli(*command, env=env)
    assert code == 0, out
    assert out.startswith("ok: ")
    assert "signatures verified" in out
    stream = await _an_operation_stream(audited_db)
    await _untriggered(
        audited_db,
        "UPDATE audit_log SET record = record || '{\"x\": 1}' WHERE stream = $1 AND seq = 2",
        stream,
    )
    code, out = await run_cli(*command, env=env)
    assert code == 1
    assert f"first broken record: stream {stream} seq 2 " in out
    code, out = await run_cli(*command, "--since", "2999-01-01T00:00:00Z", env=env)
    assert code == 0
    assert out.startswith("ok: 0 records")


async def test_checkpoints_cover_only_moved_heads(audited_db: asyncpg.Connection) -> None:
    """A second checkpoint with nothing new signs nothing; a new record is in the next one."""
    key = AUDIT_KEY.encode()
    assert await records.write_checkpoint(audited_db, key, "test") is None
    await records.append_batch(audited_db, "requests/test", "request", [{"decision": "deny"}])
    written = await records.write_checkpoint(audited_db, key, "test")
    assert written is not None
    heads = await audited_db.fetchval(
        "SELECT heads::text FROM audit_checkpoints WHERE checkpoint_id = $1", written[0]
    )
    assert '"requests/test"' in heads
    assert heads.count("[") == 2
    assert (await _verify(audited_db)).ok
